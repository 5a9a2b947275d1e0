//! The AWS cloud config (spec A1): gcfg-style INI with `[Global]` and any number of
//! `[ServiceOverride "<id>"]` sections, read as tolerantly as the Go provider reads it
//! (`gcfg.FatalOnly`): a file that starts the Go provider starts this one.
//!
//! - Every `[Global]` option of the newest provider and of 1.20 is accepted;
//!   `DisableStrictZoneCheck` (removed upstream in 2023) is accepted and ignored with a warning.
//! - Unknown sections and unknown keys are warned about, one line each naming the section, the
//!   key and the line (gcfg's "extra data", which upstream drops). Invalid values of known keys
//!   are errors naming section, key, value and line.
//! - `[ServiceOverride]` accepts any AWS service identifier, as upstream does (its overrides are
//!   keyed by any service name; 1.20 used `autoscaling` for instance groups, for example).
//!   The services this provider calls are matched case-insensitively by their 1.20 (SDK v1
//!   endpoint ID) or newest (SDK v2 service ID) names: `ec2`/`EC2`,
//!   `elasticloadbalancing`/`Elastic Load Balancing`, `Elastic Load Balancing v2` (1.20's
//!   `elasticloadbalancing` also applies to ELBv2, as it did then), `ec2metadata`/`ec2imds`,
//!   `sts` (Rust addition: STS is overridable). Overrides for services it never calls (`kms`,
//!   `autoscaling`, `s3`, …) are kept, logged once as unused by [`CloudConfig::unused_overrides`],
//!   and never an error.
//! - Sections with the same subsection name are merged, later keys winning (gcfg fills one map
//!   entry); `[ServiceOverride]` without a subsection is the entry named `""`, as in gcfg.
//! - Two overrides of one service with the same spelling and region are an error (as upstream).
//!   When one service is overridden under two spellings (a file written for both the 1.20 and
//!   the newest provider), the newest spelling wins, then the 1.20 one, and the other is
//!   reported with a warning.
//!
//! Deliberate differences (each more tolerant or clearer, never stricter for a file upstream
//! runs with): `NodeIPFamilies` values are case-insensitive and a repeated family is ignored
//! with a warning (upstream would list its addresses twice); an override's `URL` is checked
//! at start-up for the services this provider calls (upstream fails on the first call), and
//! only warned about for the others; `Service` values that cannot be a service identifier
//! (a URL pasted into it, say) are errors.

use std::collections::BTreeMap;

use regex::Regex;
use tracing::warn;

use k8s_cloud_provider::gcfg::{self, Section};

/// Address families for node addresses, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpFamily {
    /// `ipv4`
    Ipv4,
    /// `ipv6`
    Ipv6,
}

/// An AWS API whose endpoint can be overridden.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AwsService {
    /// EC2.
    Ec2,
    /// Classic Elastic Load Balancing.
    Elb,
    /// Elastic Load Balancing v2 (NLB/ALB).
    Elbv2,
    /// KMS (no call is made; accepted for compatibility).
    Kms,
    /// STS.
    Sts,
    /// Instance metadata (only the URL is used).
    Imds,
}

impl AwsService {
    /// The services this provider calls (the others' overrides are unused).
    pub const CALLED: [AwsService; 5] = [Self::Ec2, Self::Elb, Self::Elbv2, Self::Sts, Self::Imds];

    /// The services a `Service = …` value designates (`elasticloadbalancing` means both ELB
    /// APIs, as it did with SDK v1), or `None` for a service this provider knows nothing of.
    pub fn parse(value: &str) -> Option<Vec<AwsService>> {
        let v = value.trim().to_ascii_lowercase();
        Some(match v.as_str() {
            "ec2" => vec![Self::Ec2],
            "elasticloadbalancing" => vec![Self::Elb, Self::Elbv2],
            "elastic load balancing" => vec![Self::Elb],
            "elastic load balancing v2" | "elasticloadbalancingv2" => vec![Self::Elbv2],
            "kms" => vec![Self::Kms],
            "sts" => vec![Self::Sts],
            "ec2metadata" | "ec2imds" => vec![Self::Imds],
            _ => return None,
        })
    }

    /// How exactly `spelling` names this service: 0 = the newest SDK's service ID as written
    /// upstream, 1 = the 1.20 endpoint ID, 2 = any other case-insensitive match.
    fn spelling_rank(self, spelling: &str) -> u8 {
        let (newest, old): (&[&str], &[&str]) = match self {
            Self::Ec2 => (&["EC2"], &["ec2"]),
            Self::Elb => (&["Elastic Load Balancing"], &["elasticloadbalancing"]),
            Self::Elbv2 => (&["Elastic Load Balancing v2"], &["elasticloadbalancing"]),
            Self::Kms => (&["KMS"], &["kms"]),
            Self::Sts => (&["STS"], &["sts"]),
            Self::Imds => (&["ec2imds"], &["ec2metadata"]),
        };
        let s = spelling.trim();
        if newest.contains(&s) {
            0
        } else if old.contains(&s) {
            1
        } else {
            2
        }
    }
}

/// Whether `value` can be an AWS service identifier: an SDK v1 endpoint ID (`ec2`,
/// `autoscaling`, `api.ecr`, `runtime.sagemaker`) or an SDK v2 service ID (`Auto Scaling`,
/// `Elastic Load Balancing v2`): a letter, then letters, digits, spaces, `.`, `-` or `_`.
pub fn is_service_identifier(value: &str) -> bool {
    let v = value.trim();
    let mut chars = v.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && v.len() <= 64
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '.' | '-' | '_'))
}

/// One `[ServiceOverride]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceOverride {
    /// The section's subsection name.
    pub id: String,
    /// The `Service` value as written.
    pub service: String,
    /// `Region`.
    pub region: String,
    /// `URL`.
    pub url: String,
    /// `SigningRegion`.
    pub signing_region: String,
    /// `SigningName`.
    pub signing_name: String,
    /// `SigningMethod` (parsed, unused, as in the newest provider).
    pub signing_method: String,
    /// Line of the (first) section header, for messages.
    pub line: usize,
}

impl ServiceOverride {
    /// The services this override designates that this provider knows (empty for others).
    pub fn services(&self) -> Vec<AwsService> {
        AwsService::parse(&self.service).unwrap_or_default()
    }

    /// Whether this provider calls any service this override designates.
    pub fn is_used(&self) -> bool {
        self.services().iter().any(|s| AwsService::CALLED.contains(s))
    }

    fn display_name(&self) -> String {
        format!("[ServiceOverride {:?}]", self.id)
    }
}

/// The parsed config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudConfig {
    /// `Zone` (region derived from it when `Region` is empty).
    pub zone: String,
    /// `Region`.
    pub region: String,
    /// `VPC`.
    pub vpc: String,
    /// `SubnetID`.
    pub subnet_id: String,
    /// `RouteTableID`.
    pub route_table_id: String,
    /// `RoleARN`.
    pub role_arn: String,
    /// `SourceARN`.
    pub source_arn: String,
    /// `KubernetesClusterTag` (legacy tag `KubernetesCluster=<id>`).
    pub kubernetes_cluster_tag: String,
    /// `KubernetesClusterID`.
    pub kubernetes_cluster_id: String,
    /// `DisableSecurityGroupIngress`.
    pub disable_security_group_ingress: bool,
    /// `ElbSecurityGroup`.
    pub elb_security_group: String,
    /// `NodeIPFamilies` (default `[ipv4]`).
    pub node_ip_families: Vec<IpFamily>,
    /// `ClusterServiceLoadBalancerHealthProbeMode` (`""` or `Shared` or `ServiceNodePort`).
    pub cluster_service_load_balancer_health_probe_mode: String,
    /// `ClusterServiceSharedLoadBalancerHealthProbePort` (0 ⇒ 10256).
    pub cluster_service_shared_load_balancer_health_probe_port: i32,
    /// `ClusterServiceSharedLoadBalancerHealthProbePath` (`""` ⇒ `/healthz`).
    pub cluster_service_shared_load_balancer_health_probe_path: String,
    /// `SupportedTopologyInstanceTypePattern` (validated regex).
    pub supported_topology_instance_type_pattern: String,
    /// `NLBSecurityGroupMode` (`""` or `Managed`).
    pub nlb_security_group_mode: String,
    /// The `[ServiceOverride]` sections.
    pub service_overrides: Vec<ServiceOverride>,
}

/// The default `SupportedTopologyInstanceTypePattern`.
pub const DEFAULT_TOPOLOGY_PATTERN: &str = r"^(hpc|trn|p)[0-9]+[a-z]*(-[a-z0-9]+)?\.[0-9a-z]+$";

impl Default for CloudConfig {
    fn default() -> Self {
        Self {
            zone: String::new(),
            region: String::new(),
            vpc: String::new(),
            subnet_id: String::new(),
            route_table_id: String::new(),
            role_arn: String::new(),
            source_arn: String::new(),
            kubernetes_cluster_tag: String::new(),
            kubernetes_cluster_id: String::new(),
            disable_security_group_ingress: false,
            elb_security_group: String::new(),
            node_ip_families: vec![IpFamily::Ipv4],
            cluster_service_load_balancer_health_probe_mode: String::new(),
            cluster_service_shared_load_balancer_health_probe_port: 0,
            cluster_service_shared_load_balancer_health_probe_path: String::new(),
            supported_topology_instance_type_pattern: DEFAULT_TOPOLOGY_PATTERN.into(),
            nlb_security_group_mode: String::new(),
            service_overrides: Vec::new(),
        }
    }
}

/// A config error; the message names section, key and value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file is not valid gcfg.
    #[error("cloud config: {0}")]
    Syntax(#[from] gcfg::SyntaxError),
    /// The file is not UTF-8.
    #[error("cloud config: the file is not valid UTF-8")]
    Encoding,
    /// A value is invalid.
    #[error("cloud config: {section} {key} = {value:?} (line {line}): {reason}")]
    Value {
        /// Section as written.
        section: String,
        /// Key.
        key: String,
        /// Value.
        value: String,
        /// Line.
        line: usize,
        /// Why.
        reason: String,
    },
    /// A cross-field rule is broken.
    #[error("cloud config: {0}")]
    Invalid(String),
}

const GLOBAL_KEYS: &[&str] = &[
    "Zone",
    "Region",
    "VPC",
    "SubnetID",
    "RouteTableID",
    "RoleARN",
    "SourceARN",
    "KubernetesClusterTag",
    "KubernetesClusterID",
    "DisableSecurityGroupIngress",
    "ElbSecurityGroup",
    "NodeIPFamilies",
    "ClusterServiceLoadBalancerHealthProbeMode",
    "ClusterServiceSharedLoadBalancerHealthProbePort",
    "ClusterServiceSharedLoadBalancerHealthProbePath",
    "SupportedTopologyInstanceTypePattern",
    "NLBSecurityGroupMode",
    "DisableStrictZoneCheck",
];

fn canonical_key<'a>(known: &[&'a str], key: &str) -> Option<&'a str> {
    known.iter().find(|k| k.eq_ignore_ascii_case(key)).copied()
}

impl CloudConfig {
    /// Parses and validates a config file. `None` (no `--cloud-config`) gives the defaults.
    pub fn parse(bytes: Option<&[u8]>) -> Result<Self, ConfigError> {
        let mut cfg = Self::default();
        let Some(bytes) = bytes else { return Ok(cfg) };
        let text = std::str::from_utf8(bytes).map_err(|_| ConfigError::Encoding)?;
        let sections = gcfg::parse(text)?;
        let mut families_set = false;
        // gcfg fills one map entry per subsection name: same-named sections are merged.
        let mut overrides: Vec<(String, Vec<&Section>)> = Vec::new();
        for section in &sections {
            if section.is("Global") && section.subsection.is_none() {
                cfg.apply_global(section, &mut families_set)?;
            } else if section.is("ServiceOverride") {
                let id = section.subsection.clone().unwrap_or_default();
                match overrides.iter_mut().find(|(known, _)| *known == id) {
                    Some((_, parts)) => parts.push(section),
                    None => overrides.push((id, vec![section])),
                }
            } else {
                warn!(section = %section.display_name(), line = section.line, "cloud config: ignoring unknown section");
            }
        }
        for (id, parts) in overrides {
            cfg.service_overrides.push(parse_override(id, &parts)?);
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// The overrides of services this provider never calls (`kms`, `autoscaling`, `s3`, …):
    /// accepted as upstream accepts them, and to be logged once by the caller.
    pub fn unused_overrides(&self) -> Vec<&ServiceOverride> {
        self.service_overrides.iter().filter(|o| !o.is_used()).collect()
    }

    fn apply_global(&mut self, section: &Section, families_set: &mut bool) -> Result<(), ConfigError> {
        for e in &section.entries {
            let Some(key) = canonical_key(GLOBAL_KEYS, &e.key) else {
                warn!(key = %e.key, line = e.line, "cloud config: ignoring unknown key in [Global]");
                continue;
            };
            let bad = |reason: &str| ConfigError::Value {
                section: "[Global]".into(),
                key: key.into(),
                value: e.value.clone().unwrap_or_default(),
                line: e.line,
                reason: reason.into(),
            };
            // A key without `=`: true for booleans, a reset for the list, an error otherwise
            // (gcfg: "blank value not supported for type").
            if e.value.is_none() {
                match key {
                    "DisableSecurityGroupIngress" | "DisableStrictZoneCheck" => {}
                    "NodeIPFamilies" => {
                        self.node_ip_families = vec![IpFamily::Ipv4];
                        *families_set = false;
                        continue;
                    }
                    _ => return Err(bad(&format!("needs a value (write `{key} = <value>`)"))),
                }
            }
            let value = e.value.clone().unwrap_or_default();
            match key {
                "Zone" => self.zone = value,
                "Region" => self.region = value,
                "VPC" => self.vpc = value,
                "SubnetID" => self.subnet_id = value,
                "RouteTableID" => self.route_table_id = value,
                "RoleARN" => self.role_arn = value,
                "SourceARN" => self.source_arn = value,
                "KubernetesClusterTag" => self.kubernetes_cluster_tag = value,
                "KubernetesClusterID" => self.kubernetes_cluster_id = value,
                "ElbSecurityGroup" => self.elb_security_group = value,
                "ClusterServiceSharedLoadBalancerHealthProbePath" => {
                    self.cluster_service_shared_load_balancer_health_probe_path = value
                }
                "NLBSecurityGroupMode" => {
                    if !(value.is_empty() || value == "Managed") {
                        return Err(bad("must be empty or \"Managed\""));
                    }
                    self.nlb_security_group_mode = value;
                }
                "ClusterServiceLoadBalancerHealthProbeMode" => {
                    if !(value.is_empty() || value == "Shared" || value == "ServiceNodePort") {
                        return Err(bad("must be \"Shared\" or \"ServiceNodePort\""));
                    }
                    self.cluster_service_load_balancer_health_probe_mode = value;
                }
                "DisableSecurityGroupIngress" => {
                    self.disable_security_group_ingress = gcfg::parse_bool(e.value.as_deref())
                        .ok_or_else(|| bad("not a boolean (true/false)"))?;
                }
                "DisableStrictZoneCheck" => {
                    gcfg::parse_bool(e.value.as_deref()).ok_or_else(|| bad("not a boolean (true/false)"))?;
                    warn!(
                        line = e.line,
                        "cloud config: [Global] DisableStrictZoneCheck was removed upstream and is ignored"
                    );
                }
                "ClusterServiceSharedLoadBalancerHealthProbePort" => {
                    let port = gcfg::parse_int(&value).ok_or_else(|| bad("not an integer"))?;
                    if !(0..=65535).contains(&port) {
                        return Err(bad("must be a port number (0 = 10256)"));
                    }
                    self.cluster_service_shared_load_balancer_health_probe_port = port as i32;
                }
                "SupportedTopologyInstanceTypePattern" => {
                    Regex::new(&value).map_err(|e| bad(&format!("not a valid regular expression: {e}")))?;
                    self.supported_topology_instance_type_pattern = value;
                }
                "NodeIPFamilies" => {
                    let family = match value.trim().to_ascii_lowercase().as_str() {
                        "ipv4" => IpFamily::Ipv4,
                        "ipv6" => IpFamily::Ipv6,
                        _ => return Err(bad("must be ipv4 or ipv6")),
                    };
                    if !*families_set {
                        self.node_ip_families.clear();
                        *families_set = true;
                    }
                    if self.node_ip_families.contains(&family) {
                        warn!(
                            line = e.line,
                            value = %value,
                            "cloud config: [Global] NodeIPFamilies lists this family twice; the repeat is ignored"
                        );
                        continue;
                    }
                    self.node_ip_families.push(family);
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !self.kubernetes_cluster_tag.is_empty()
            && !self.kubernetes_cluster_id.is_empty()
            && self.kubernetes_cluster_tag != self.kubernetes_cluster_id
        {
            return Err(ConfigError::Invalid(format!(
                "[Global] KubernetesClusterTag {:?} and KubernetesClusterID {:?} must be equal when both are set",
                self.kubernetes_cluster_tag, self.kubernetes_cluster_id
            )));
        }
        if !self.zone.is_empty() && self.region.is_empty() && region_from_zone(&self.zone).is_none() {
            return Err(ConfigError::Invalid(format!(
                "[Global] Zone {:?} is not an availability zone name",
                self.zone
            )));
        }
        // Upstream: the same (Service, Region) twice is an error.
        let mut exact: BTreeMap<(String, String), &ServiceOverride> = BTreeMap::new();
        for o in &self.service_overrides {
            if let Some(other) = exact.insert((o.service.clone(), o.region.clone()), o) {
                return Err(ConfigError::Invalid(format!(
                    "{} (line {}) and {} (line {}) both override {:?} in region {:?}",
                    o.display_name(),
                    o.line,
                    other.display_name(),
                    other.line,
                    o.service,
                    o.region
                )));
            }
        }
        // One service under two spellings: say which one is used.
        for o in &self.service_overrides {
            for service in o.services() {
                if let Some(winner) = self.override_for(service, &o.region)
                    && !std::ptr::eq(winner, o)
                {
                    warn!(
                        shadowed = %o.display_name(),
                        used = %winner.display_name(),
                        region = %o.region,
                        "cloud config: two [ServiceOverride] sections override {service:?}; the one spelled as the newest provider does is used"
                    );
                }
            }
        }
        Ok(())
    }

    /// The cluster ID (`KubernetesClusterID`, else `KubernetesClusterTag`), if configured.
    pub fn cluster_id(&self) -> Option<&str> {
        [&self.kubernetes_cluster_id, &self.kubernetes_cluster_tag]
            .into_iter()
            .find(|s| !s.is_empty())
            .map(String::as_str)
    }

    /// Whether legacy `KubernetesCluster` tags are in use.
    pub fn legacy_tags(&self) -> bool {
        !self.kubernetes_cluster_tag.is_empty()
    }

    /// The configured region: `Region`, else derived from `Zone`.
    pub fn configured_region(&self) -> Option<String> {
        if !self.region.is_empty() {
            return Some(self.region.clone());
        }
        region_from_zone(&self.zone)
    }

    /// Whether the control plane runs outside AWS (or in another account): VPC + (SubnetID or
    /// RoleARN) + cluster ID, so no self-instance lookup through IMDS is needed.
    pub fn outside_aws(&self) -> bool {
        !self.vpc.is_empty()
            && (!self.subnet_id.is_empty() || !self.role_arn.is_empty())
            && self.cluster_id().is_some()
    }

    /// The override for `service` in `region`, if any (the region is not checked for IMDS).
    /// When several sections override the service under different spellings, the newest
    /// provider's spelling wins, then 1.20's, then the first in the file.
    pub fn override_for(&self, service: AwsService, region: &str) -> Option<&ServiceOverride> {
        self.service_overrides
            .iter()
            .filter(|o| {
                o.services().contains(&service) && (o.region == region || service == AwsService::Imds)
            })
            .min_by_key(|o| (service.spelling_rank(&o.service), o.line))
    }
}

fn parse_override(id: String, sections: &[&Section]) -> Result<ServiceOverride, ConfigError> {
    const KEYS: &[&str] = &[
        "Service",
        "Region",
        "URL",
        "SigningRegion",
        "SigningName",
        "SigningMethod",
    ];
    let mut o = ServiceOverride {
        id,
        service: String::new(),
        region: String::new(),
        url: String::new(),
        signing_region: String::new(),
        signing_name: String::new(),
        signing_method: String::new(),
        line: sections.first().map_or(0, |s| s.line),
    };
    let name = o.display_name();
    let mut url_line = 0;
    for e in sections.iter().flat_map(|s| &s.entries) {
        let Some(key) = canonical_key(KEYS, &e.key) else {
            warn!(section = %name, key = %e.key, line = e.line, "cloud config: ignoring unknown key");
            continue;
        };
        let bad = |reason: String| ConfigError::Value {
            section: name.clone(),
            key: key.into(),
            value: e.value.clone().unwrap_or_default(),
            line: e.line,
            reason,
        };
        let Some(raw) = &e.value else {
            return Err(bad(format!("needs a value (write `{key} = <value>`)")));
        };
        // Upstream trims these (gcfg does not).
        let value = raw.trim().to_string();
        match key {
            "Service" => {
                if !value.is_empty() && !is_service_identifier(&value) {
                    return Err(bad(
                        "not an AWS service identifier (e.g. EC2, Elastic Load Balancing, Elastic Load Balancing v2, ec2imds, or the 1.20 names ec2, elasticloadbalancing, ec2metadata)".into(),
                    ));
                }
                o.service = value;
            }
            "Region" => o.region = value,
            "URL" => {
                o.url = value;
                url_line = e.line;
            }
            "SigningRegion" => o.signing_region = value,
            "SigningName" => o.signing_name = value,
            "SigningMethod" => o.signing_method = value,
            _ => {}
        }
    }
    for (key, value) in [
        ("Service", &o.service),
        ("Region", &o.region),
        ("URL", &o.url),
        ("SigningRegion", &o.signing_region),
    ] {
        if value.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "{name} (line {}): {key} must be set",
                o.line
            )));
        }
    }
    let url_ok =
        (o.url.starts_with("http://") || o.url.starts_with("https://")) && o.url.parse::<http::Uri>().is_ok();
    if !url_ok {
        if o.is_used() {
            return Err(ConfigError::Value {
                section: name,
                key: "URL".into(),
                value: o.url,
                line: url_line,
                reason: "not an http(s) URL".into(),
            });
        }
        warn!(section = %name, url = %o.url, line = url_line, "cloud config: the URL of an unused override is not an http(s) URL");
    }
    Ok(o)
}

/// `us-east-1a` → `us-east-1` (one or more `letters-` groups then digits).
pub fn region_from_zone(zone: &str) -> Option<String> {
    static RE: std::sync::LazyLock<Regex> =
        std::sync::LazyLock::new(|| Regex::new(r"^([a-zA-Z]+-)+\d+").expect("static regex"));
    RE.find(zone).map(|m| m.as_str().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<CloudConfig, ConfigError> {
        CloudConfig::parse(Some(s.as_bytes()))
    }

    #[test]
    fn no_file_gives_defaults() {
        let c = CloudConfig::parse(None).unwrap();
        assert_eq!(c.node_ip_families, vec![IpFamily::Ipv4]);
        assert!(c.cluster_id().is_none());
        assert!(!c.outside_aws());
    }

    #[test]
    fn every_global_option_case_insensitively() {
        let c = parse(
            "[global]\nzone = us-west-2b\nREGION = us-west-2\nVPC = vpc-1\nSubnetID = subnet-1\nRouteTableID = rtb-1\n\
             RoleARN = arn:aws:iam::123456789012:role/ccm\nSourceARN = arn:aws:eks:x\nKubernetesClusterTag = c1\n\
             KubernetesClusterID = c1\nDisableSecurityGroupIngress = true\nElbSecurityGroup = sg-1\n\
             NodeIPFamilies = ipv6\nNodeIPFamilies = ipv4\nClusterServiceLoadBalancerHealthProbeMode = Shared\n\
             ClusterServiceSharedLoadBalancerHealthProbePort = 10257\nClusterServiceSharedLoadBalancerHealthProbePath = /hz\n\
             SupportedTopologyInstanceTypePattern = ^p5\\\\..*$\nNLBSecurityGroupMode = Managed\nDisableStrictZoneCheck = true\nUnknownKey = 1\n",
        )
        .unwrap();
        assert_eq!(c.zone, "us-west-2b");
        assert_eq!(c.region, "us-west-2");
        assert_eq!(c.node_ip_families, vec![IpFamily::Ipv6, IpFamily::Ipv4]);
        assert!(c.disable_security_group_ingress);
        assert_eq!(c.cluster_service_shared_load_balancer_health_probe_port, 10257);
        assert_eq!(c.supported_topology_instance_type_pattern, "^p5\\..*$");
        assert_eq!(c.cluster_id(), Some("c1"));
        assert!(c.legacy_tags());
        assert!(c.outside_aws());
        assert_eq!(c.nlb_security_group_mode, "Managed");
    }

    #[test]
    fn service_overrides_old_and_new_names() {
        let c = parse(
            "[Global]\nRegion = us-east-1\n\
             [ServiceOverride \"1\"]\nService = ec2\nRegion = us-east-1\nURL = http://127.0.0.1:5000\nSigningRegion = us-east-1\n\
             [ServiceOverride \"2\"]\nService = Elastic Load Balancing v2\nRegion = us-east-1\nURL = http://127.0.0.1:5001\nSigningRegion = us-east-1\nSigningName = elasticloadbalancing\n\
             [ServiceOverride \"3\"]\nService = elastic load balancing\nRegion = us-east-1\nURL = http://127.0.0.1:5002\nSigningRegion = us-east-1\n",
        )
        .unwrap();
        assert_eq!(
            c.override_for(AwsService::Ec2, "us-east-1").unwrap().url,
            "http://127.0.0.1:5000"
        );
        assert_eq!(
            c.override_for(AwsService::Elbv2, "us-east-1").unwrap().url,
            "http://127.0.0.1:5001"
        );
        assert_eq!(
            c.override_for(AwsService::Elb, "us-east-1").unwrap().url,
            "http://127.0.0.1:5002"
        );
        assert!(c.override_for(AwsService::Ec2, "eu-west-1").is_none());
        // 1.20's elasticloadbalancing covers both ELB APIs.
        let c = parse("[ServiceOverride \"x\"]\nService = elasticloadbalancing\nRegion = r\nURL = https://elb.local\nSigningRegion = r\n").unwrap();
        assert!(
            c.override_for(AwsService::Elb, "r").is_some()
                && c.override_for(AwsService::Elbv2, "r").is_some()
        );
    }

    #[test]
    fn every_error_names_section_key_and_value() {
        let cases: Vec<(&str, &str)> = vec![
            (
                "[Global]\nDisableSecurityGroupIngress = maybe",
                "cloud config: [Global] DisableSecurityGroupIngress = \"maybe\" (line 2): not a boolean",
            ),
            (
                "[Global]\nNodeIPFamilies = ipv5",
                "[Global] NodeIPFamilies = \"ipv5\" (line 2): must be ipv4 or ipv6",
            ),
            (
                "[Global]\nClusterServiceSharedLoadBalancerHealthProbePort = x",
                "ClusterServiceSharedLoadBalancerHealthProbePort = \"x\" (line 2): not an integer",
            ),
            (
                "[Global]\nClusterServiceSharedLoadBalancerHealthProbePort = 70000",
                "must be a port number",
            ),
            (
                "[Global]\nSupportedTopologyInstanceTypePattern = (",
                "SupportedTopologyInstanceTypePattern = \"(\" (line 2): not a valid regular expression",
            ),
            (
                "[Global]\nNLBSecurityGroupMode = Yes",
                "NLBSecurityGroupMode = \"Yes\" (line 2): must be empty or \"Managed\"",
            ),
            (
                "[Global]\nDisableStrictZoneCheck = perhaps",
                "DisableStrictZoneCheck = \"perhaps\"",
            ),
            (
                "[Global]\nKubernetesClusterTag = a\nKubernetesClusterID = b",
                "KubernetesClusterTag \"a\" and KubernetesClusterID \"b\" must be equal",
            ),
            (
                "[Global]\nClusterServiceLoadBalancerHealthProbeMode = Weird",
                "[Global] ClusterServiceLoadBalancerHealthProbeMode = \"Weird\" (line 2): must be \"Shared\" or \"ServiceNodePort\"",
            ),
            (
                "[Global]\nZone = nowhere",
                "[Global] Zone \"nowhere\" is not an availability zone name",
            ),
            (
                "[ServiceOverride \"a\"]\nService = https://ec2.local\nRegion = r\nURL = http://x\nSigningRegion = r",
                "[ServiceOverride \"a\"] Service = \"https://ec2.local\" (line 2): not an AWS service identifier",
            ),
            (
                "[ServiceOverride \"a\"]\nService = EC2\nRegion = r\nURL = ftp://x\nSigningRegion = r",
                "URL = \"ftp://x\" (line 4): not an http(s) URL",
            ),
            (
                "[ServiceOverride \"a\"]\nService = EC2\nRegion = r\nURL = http://x",
                "[ServiceOverride \"a\"] (line 1): SigningRegion must be set",
            ),
            (
                "[ServiceOverride \"a\"]\nService = EC2\nURL = http://x\nSigningRegion = r",
                "[ServiceOverride \"a\"] (line 1): Region must be set",
            ),
            (
                "[ServiceOverride \"a\"]\nService = EC2\nRegion = r\nURL = http://x\nSigningRegion = r\n[ServiceOverride \"b\"]\nService = EC2\nRegion = r\nURL = http://y\nSigningRegion = r",
                "[ServiceOverride \"b\"] (line 6) and [ServiceOverride \"a\"] (line 1) both override \"EC2\" in region \"r\"",
            ),
            (
                "[Global]\nZone",
                "[Global] Zone = \"\" (line 2): needs a value (write `Zone = <value>`)",
            ),
            (
                "[ServiceOverride \"a\"]\nService\nRegion = r",
                "[ServiceOverride \"a\"] Service = \"\" (line 2): needs a value",
            ),
            ("Region = x", "cloud config: line 1"),
        ];
        for (input, expected) in cases {
            let e = parse(input).unwrap_err().to_string();
            assert!(
                e.contains(expected),
                "input {input:?}: expected {expected:?} in {e:?}"
            );
        }
        assert_eq!(
            CloudConfig::parse(Some(&[0xff, 0xfe])).unwrap_err(),
            ConfigError::Encoding
        );
    }

    #[test]
    fn any_service_identifier_is_accepted_and_unused_ones_are_listed() {
        let c = parse(
            "[ServiceOverride \"asg\"]\nService = autoscaling\nRegion = us-east-1\nURL = https://autoscaling.corp.example\nSigningRegion = us-east-1\nSigningMethod = v4\n\
             [ServiceOverride \"s3\"]\nService = s3\nRegion = us-east-1\nURL = s3.corp.example\nSigningRegion = us-east-1\n\
             [ServiceOverride \"kms\"]\nService = KMS\nRegion = us-east-1\nURL = https://kms.corp.example\nSigningRegion = us-east-1\n\
             [ServiceOverride \"sm\"]\nService = runtime.sagemaker\nRegion = us-east-1\nURL = https://x.example\nSigningRegion = us-east-1\n\
             [ServiceOverride \"v2\"]\nService = Auto Scaling\nRegion = us-east-1\nURL = https://autoscaling.corp.example\nSigningRegion = us-east-1\n\
             [ServiceOverride \"ec2\"]\nService = ec2\nRegion = us-east-1\nURL = https://ec2.corp.example\nSigningRegion = us-east-1\n",
        )
        .unwrap();
        let unused: Vec<&str> = c.unused_overrides().iter().map(|o| o.id.as_str()).collect();
        assert_eq!(unused, ["asg", "s3", "kms", "sm", "v2"]);
        assert_eq!(c.override_for(AwsService::Ec2, "us-east-1").unwrap().id, "ec2");
        assert!(c.override_for(AwsService::Elb, "us-east-1").is_none());
        assert!(is_service_identifier("Elastic Load Balancing v2"));
        assert!(is_service_identifier("api.ecr"));
        assert!(!is_service_identifier("ec2;"));
        assert!(!is_service_identifier("1ec2"));
        assert!(!is_service_identifier(""));
    }

    #[test]
    fn both_spellings_of_one_service_the_newest_wins() {
        // A file written for both the 1.20 and the newest provider.
        let c = parse(
            "[ServiceOverride \"old-elb\"]\nService = elasticloadbalancing\nRegion = r\nURL = http://old\nSigningRegion = r\n\
             [ServiceOverride \"new-elbv2\"]\nService = Elastic Load Balancing v2\nRegion = r\nURL = http://v2\nSigningRegion = r\n\
             [ServiceOverride \"odd\"]\nService = eC2\nRegion = r\nURL = http://odd\nSigningRegion = r\n\
             [ServiceOverride \"old-ec2\"]\nService = ec2\nRegion = r\nURL = http://ec2\nSigningRegion = r\n",
        )
        .unwrap();
        assert_eq!(c.override_for(AwsService::Elbv2, "r").unwrap().url, "http://v2");
        assert_eq!(c.override_for(AwsService::Elb, "r").unwrap().url, "http://old");
        assert_eq!(c.override_for(AwsService::Ec2, "r").unwrap().url, "http://ec2");
    }

    #[test]
    fn same_subsection_sections_merge_and_a_bare_header_is_the_empty_id() {
        let c = parse(
            "[ServiceOverride \"1\"]\nService = ec2\nRegion = r\n[Global]\nRegion = r\n\
             [ServiceOverride \"1\"]\nURL = http://a\nSigningRegion = r\nURL = http://b\n\
             [ServiceOverride]\nService = sts\nRegion = r\nURL = http://sts\nSigningRegion = r\n",
        )
        .unwrap();
        assert_eq!(c.service_overrides.len(), 2);
        let o = c.override_for(AwsService::Ec2, "r").unwrap();
        assert_eq!((o.id.as_str(), o.url.as_str(), o.line), ("1", "http://b", 1));
        assert_eq!(c.override_for(AwsService::Sts, "r").unwrap().id, "");
    }

    #[test]
    fn blank_values_hex_ints_and_repeated_families() {
        let c = parse(
            "[Global]\nDisableSecurityGroupIngress\nNodeIPFamilies = ipv6\nNodeIPFamilies\nNodeIPFamilies = ipv6\n\
             NodeIPFamilies = IPv6\nNodeIPFamilies = ipv4\nClusterServiceSharedLoadBalancerHealthProbePort = 0x2811\n",
        )
        .unwrap();
        assert!(c.disable_security_group_ingress);
        assert_eq!(c.node_ip_families, vec![IpFamily::Ipv6, IpFamily::Ipv4]);
        assert_eq!(c.cluster_service_shared_load_balancer_health_probe_port, 0x2811);
        let c = parse("[Global]\nNodeIPFamilies = ipv6\nNodeIPFamilies\n").unwrap();
        assert_eq!(
            c.node_ip_families,
            vec![IpFamily::Ipv4],
            "a blank list key resets to the default"
        );
    }

    #[test]
    fn unknown_sections_and_keys_are_not_errors() {
        let c = parse(
            "[Global]\nZone = us-east-1a\nFutureKey = x\n[Global \"sub\"]\nA = 1\n[Unknown]\nB\n[ServiceOverride \"e\"]\n\
             Service = EC2\nRegion = us-east-1\nURL = http://e\nSigningRegion = us-east-1\nExtra = 1\n",
        )
        .unwrap();
        assert_eq!(c.zone, "us-east-1a");
        assert_eq!(c.service_overrides.len(), 1);
    }

    #[test]
    fn region_derivation() {
        assert_eq!(region_from_zone("us-east-1a").as_deref(), Some("us-east-1"));
        assert_eq!(
            region_from_zone("ap-southeast-2c").as_deref(),
            Some("ap-southeast-2")
        );
        assert_eq!(
            region_from_zone("us-gov-west-1b").as_deref(),
            Some("us-gov-west-1")
        );
        assert_eq!(region_from_zone("bogus"), None);
        let c = parse("[Global]\nZone = eu-west-1c").unwrap();
        assert_eq!(c.configured_region().as_deref(), Some("eu-west-1"));
    }
}
