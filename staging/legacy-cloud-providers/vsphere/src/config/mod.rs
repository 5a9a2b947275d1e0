//! The vSphere cloud config (spec B1): the CPI's YAML (tried first), the CPI's INI and the
//! 1.20 in-tree INI, then environment overrides.
//!
//! - In-tree keys the CPI dropped (`[Workspace]`, `[Disk]`, `[Network] public-network`,
//!   `vm-uuid`, `vm-name`, `working-dir`, `datastore`, `secret-not-managed`) are accepted,
//!   reported in [`VsphereConfig::dropped`] and ignored; `datacenter` becomes `datacenters`.
//! - NSX-T, load-balancer and route sections are recognised and ignored with a warning (not
//!   supported by this provider).
//! - Environment variables (`VSPHERE_*`, `VSPHERE_VCENTER_<ID>` + `VCENTER_<ID>_*`) override
//!   the file. Unlike the Go CPI, `_INSECURE`, `_ROUNDTRIP` and `_IP_FAMILY` are honoured when
//!   set (upstream's checks are inverted).
//! - Tolerance as upstream's readers (gcfg `FatalOnly` for INI, `yaml.Unmarshal` for YAML): unknown
//!   sections and keys are warned about, one line each naming the section, the key and (INI)
//!   the line; invalid values of known keys are errors. Same-named `[VirtualCenter]` sections
//!   are merged (gcfg fills one map entry); a known key without `=` is `true` for booleans and
//!   an error otherwise (gcfg: "blank value not supported"). A YAML file that does not parse
//!   gets the YAML error, not an INI one.
//! - Errors name the section/key and the value; passwords never appear in errors or `Debug`.
//! - A per-vCenter `insecure-flag = false` (`insecureFlag: false`) under a global `true` means
//!   "verify TLS for this vCenter". (The Go CPI treats it as "inherit the global value", which
//!   silently disables verification; deliberate difference.)

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_cloud_provider::gcfg;
use serde_json::Value;
use vsphere_api::Secret;

mod cpi_yaml;
mod credentials;
mod env;
mod ini;

pub use cpi_yaml::to_cpi_yaml;
pub use credentials::{credentials_from_directory, credentials_from_secret};

/// One vCenter to connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VCenterConfig {
    /// Host name or IP.
    pub server: String,
    /// Port (443).
    pub port: u16,
    /// User (may come from a Secret later).
    pub user: String,
    /// Password.
    pub password: Secret,
    /// Skip TLS verification.
    pub insecure: bool,
    /// Datacenters to search (all when empty).
    pub datacenters: Vec<String>,
    /// SOAP retries.
    pub soap_roundtrip_count: u32,
    /// CA bundle path.
    pub ca_file: String,
    /// Pinned thumbprint.
    pub thumbprint: String,
    /// Credentials Secret name.
    pub secret_name: String,
    /// Credentials Secret namespace.
    pub secret_namespace: String,
    /// IP families (`ipv4`, `ipv6`).
    pub ip_family: Vec<String>,
}

/// Node address selection (`[Nodes]` / `nodes:`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodesConfig {
    /// Preferred CIDRs for InternalIP.
    pub internal_network_subnet_cidr: Vec<IpNet>,
    /// Preferred CIDRs for ExternalIP.
    pub external_network_subnet_cidr: Vec<IpNet>,
    /// Port group for InternalIP.
    pub internal_vm_network_name: String,
    /// Port group for ExternalIP.
    pub external_vm_network_name: String,
    /// CIDRs never used for InternalIP.
    pub exclude_internal_network_subnet_cidr: Vec<IpNet>,
    /// CIDRs never used for ExternalIP.
    pub exclude_external_network_subnet_cidr: Vec<IpNet>,
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VsphereConfig {
    /// The `global` defaults (also an implicit vCenter when `server` is set).
    pub global: VCenterConfig,
    /// Global secrets directory.
    pub secrets_directory: String,
    /// vCenters by label.
    pub vcenters: BTreeMap<String, VCenterConfig>,
    /// Zone tag category.
    pub zone_category: String,
    /// Region tag category.
    pub region_category: String,
    /// Node address selection.
    pub nodes: NodesConfig,
    /// In-tree keys that were read and ignored, with why (for the converter's comments).
    pub dropped: Vec<(String, String, String)>,
    /// Which format the file had.
    pub format: Format,
}

/// The file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// CPI YAML.
    Yaml,
    /// INI (CPI or in-tree).
    Ini,
    /// No file.
    None,
}

/// A config error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("vsphere cloud config: {0}")]
pub struct ConfigError(pub String);

fn default_vcenter() -> VCenterConfig {
    VCenterConfig {
        server: String::new(),
        port: 443,
        user: String::new(),
        password: Secret::default(),
        insecure: false,
        datacenters: Vec::new(),
        soap_roundtrip_count: 3,
        ca_file: String::new(),
        thumbprint: String::new(),
        secret_name: String::new(),
        secret_namespace: String::new(),
        ip_family: vec!["ipv4".into()],
    }
}

impl Default for VsphereConfig {
    fn default() -> Self {
        Self {
            global: default_vcenter(),
            secrets_directory: String::new(),
            vcenters: BTreeMap::new(),
            zone_category: String::new(),
            region_category: String::new(),
            nodes: NodesConfig::default(),
            dropped: Vec::new(),
            format: Format::None,
        }
    }
}

fn split_list(v: &str) -> Vec<String> {
    v.split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn parse_cidrs(place: &str, v: &str) -> Result<Vec<IpNet>, ConfigError> {
    split_list(v)
        .iter()
        .enumerate()
        .map(|(i, c)| {
            c.parse::<IpNet>().map_err(|_| {
                ConfigError(format!(
                    "{place}: entry {} is not a CIDR (e.g. 10.0.0.0/24)",
                    i + 1
                ))
            })
        })
        .collect()
}

fn parse_bool(place: &str, v: &str) -> Result<bool, ConfigError> {
    gcfg::parse_bool(Some(v)).ok_or_else(|| ConfigError(format!("{place}: not a boolean (true/false)")))
}

fn parse_port(place: &str, v: &str) -> Result<u16, ConfigError> {
    v.trim()
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| ConfigError(format!("{place}: not a port number (1-65535)")))
}

fn parse_u32(place: &str, v: &str) -> Result<u32, ConfigError> {
    v.trim()
        .parse::<u32>()
        .map_err(|_| ConfigError(format!("{place}: not a non-negative integer")))
}

fn parse_families(place: &str, values: Vec<String>) -> Result<Vec<String>, ConfigError> {
    let mut out = Vec::new();
    for v in values {
        let f = v.trim().to_ascii_lowercase();
        if f != "ipv4" && f != "ipv6" {
            return Err(ConfigError(format!("{place}: every entry must be ipv4 or ipv6")));
        }
        if out.contains(&f) {
            return Err(ConfigError(format!("{place}: {f} listed twice")));
        }
        out.push(f);
    }
    if out.is_empty() {
        return Err(ConfigError(format!("{place}: must name ipv4 and/or ipv6")));
    }
    Ok(out)
}

/// A YAML or INI value as one string: scalars as written, a mapping or a list is an error
/// (`what` names the key; the value itself is not quoted, it may be a password).
fn scalar(what: &str, value: &Value) -> Result<String, ConfigError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Bool(_) | Value::Number(_) => Ok(value.to_string()),
        Value::Array(_) | Value::Object(_) => Err(ConfigError(format!(
            "{what}: must be a single value, not a list or a mapping"
        ))),
    }
}

/// How a key was written: with a value, or (INI) bare, without `=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    Valued,
    Bare,
}

/// Applies one vCenter key (INI name or YAML name); `Ok(false)` when the key is unknown.
fn apply_vcenter_key(
    vc: &mut VCenterConfig,
    place: &str,
    key: &str,
    value: &Value,
    written: Written,
) -> Result<bool, ConfigError> {
    let at = format!("{place} {key}");
    let canonical = key.to_ascii_lowercase().replace('_', "-");
    let is_bool = matches!(canonical.as_str(), "insecure-flag" | "insecureflag");
    let known = is_bool
        || matches!(
            canonical.as_str(),
            "user"
                | "password"
                | "server"
                | "port"
                | "datacenters"
                | "soap-roundtrip-count"
                | "soaproundtripcount"
                | "ca-file"
                | "cafile"
                | "thumbprint"
                | "secret-name"
                | "secretname"
                | "secret-namespace"
                | "secretnamespace"
                | "ip-family"
                | "ipfamily"
        );
    if !known {
        return Ok(false);
    }
    if written == Written::Bare {
        if is_bool {
            vc.insecure = true;
            return Ok(true);
        }
        return Err(ConfigError(format!(
            "{at}: needs a value (write `{key} = <value>`)"
        )));
    }
    let text = || scalar(&at, value);
    let list = || -> Result<Vec<String>, ConfigError> {
        match value {
            Value::Array(a) => a.iter().map(|x| scalar(&at, x)).collect(),
            _ => Ok(split_list(&text()?)),
        }
    };
    match canonical.as_str() {
        "user" => vc.user = text()?,
        "password" => vc.password = Secret::new(text()?),
        "server" => vc.server = text()?,
        "port" => vc.port = parse_port(&at, &text()?)?,
        "insecure-flag" | "insecureflag" => vc.insecure = parse_bool(&at, &text()?)?,
        "datacenters" => vc.datacenters = list()?,
        "soap-roundtrip-count" | "soaproundtripcount" => vc.soap_roundtrip_count = parse_u32(&at, &text()?)?,
        "ca-file" | "cafile" => vc.ca_file = text()?,
        "thumbprint" => vc.thumbprint = text()?,
        "secret-name" | "secretname" => vc.secret_name = text()?,
        "secret-namespace" | "secretnamespace" => vc.secret_namespace = text()?,
        _ => vc.ip_family = parse_families(&at, list()?)?,
    }
    Ok(true)
}

impl VsphereConfig {
    /// Parses a file: YAML first, INI when the text is not a YAML mapping. `None` (no file)
    /// gives the defaults (then environment variables must name the vCenter).
    pub fn parse(bytes: Option<&[u8]>) -> Result<Self, ConfigError> {
        let Some(bytes) = bytes else {
            return Ok(Self::default());
        };
        let text =
            std::str::from_utf8(bytes).map_err(|_| ConfigError("the file is not valid UTF-8".into()))?;
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        // INI has a `[section]` header on a line of its own; YAML never starts a line with `[`
        // outside a flow sequence value.
        let looks_like_ini = text.lines().any(|l| l.trim_start().starts_with('['));
        match crate::yaml::parse(text) {
            Ok(Value::Object(map)) if !text.trim_start().starts_with('[') => Self::from_yaml(map),
            _ if looks_like_ini => Self::from_ini(text),
            Ok(Value::Null) => Ok(Self::default()),
            Ok(_) => Err(ConfigError(
                "the file is neither a YAML mapping nor an INI file with [sections]".into(),
            )),
            Err(e) => Err(ConfigError(format!("not valid YAML: {e}"))),
        }
    }

    fn from_yaml(map: serde_json::Map<String, Value>) -> Result<Self, ConfigError> {
        let mut cfg = Self {
            format: Format::Yaml,
            ..Self::default()
        };
        for (key, value) in map {
            match key.as_str() {
                "global" => {
                    let Value::Object(g) = value else {
                        return Err(ConfigError("global: must be a mapping".into()));
                    };
                    for (k, v) in g {
                        if k == "secretsDirectory" {
                            cfg.secrets_directory = scalar("global: secretsDirectory", &v)?;
                        } else if !apply_vcenter_key(&mut cfg.global, "global:", &k, &v, Written::Valued)? {
                            tracing::warn!(key = %k, "vsphere cloud config: ignoring unknown key global.{k}");
                        }
                    }
                }
                "vcenter" => {
                    let Value::Object(vcs) = value else {
                        return Err(ConfigError(
                            "vcenter: must be a mapping of name → settings".into(),
                        ));
                    };
                    for (name, v) in vcs {
                        let Value::Object(settings) = v else {
                            return Err(ConfigError(format!("vcenter.{name}: must be a mapping")));
                        };
                        let mut vc = VCenterConfig {
                            server: String::new(),
                            ..cfg.global.clone()
                        };
                        for (k, v) in settings {
                            if !apply_vcenter_key(
                                &mut vc,
                                &format!("vcenter.{name}:"),
                                &k,
                                &v,
                                Written::Valued,
                            )? {
                                tracing::warn!(key = %k, "vsphere cloud config: ignoring unknown key vcenter.{name}.{k}");
                            }
                        }
                        if vc.server.is_empty() {
                            return Err(ConfigError(format!("vcenter.{name}: server must be set")));
                        }
                        cfg.vcenters.insert(name, vc);
                    }
                }
                "labels" => {
                    let Value::Object(labels) = value else {
                        return Err(ConfigError("labels: must be a mapping (zone, region)".into()));
                    };
                    for (k, v) in labels {
                        match k.as_str() {
                            "zone" => cfg.zone_category = scalar("labels: zone", &v)?,
                            "region" => cfg.region_category = scalar("labels: region", &v)?,
                            _ => {
                                tracing::warn!(key = %k, "vsphere cloud config: ignoring unknown key labels.{k}")
                            }
                        }
                    }
                }
                "nodes" => {
                    let Value::Object(n) = value else {
                        return Err(ConfigError("nodes: must be a mapping".into()));
                    };
                    for (k, v) in n {
                        let at = format!("nodes: {k}");
                        let s = match &v {
                            Value::Array(a) => a
                                .iter()
                                .map(|x| scalar(&at, x))
                                .collect::<Result<Vec<_>, _>>()?
                                .join(","),
                            other => scalar(&at, other)?,
                        };
                        cfg.apply_nodes_key("nodes:", &k, &s, None)?;
                    }
                }
                "nsxt" | "loadBalancer" | "loadBalancerClass" | "route" => {
                    tracing::warn!(section = %key, "vsphere cloud config: NSX-T load balancers and routes are not supported; ignoring {key}");
                }
                other => {
                    tracing::warn!(key = %other, "vsphere cloud config: ignoring unknown top-level key {other}")
                }
            }
        }
        cfg.finish()
    }

    fn apply_nodes_key(
        &mut self,
        place: &str,
        key: &str,
        value: &str,
        line: Option<usize>,
    ) -> Result<(), ConfigError> {
        let at = format!("{place} {key}");
        let n = &mut self.nodes;
        match key.to_ascii_lowercase().replace('_', "-").as_str() {
            "internal-network-subnet-cidr" | "internalnetworksubnetcidr" => {
                n.internal_network_subnet_cidr = parse_cidrs(&at, value)?
            }
            "external-network-subnet-cidr" | "externalnetworksubnetcidr" => {
                n.external_network_subnet_cidr = parse_cidrs(&at, value)?
            }
            "internal-vm-network-name" | "internalvmnetworkname" => {
                n.internal_vm_network_name = value.to_string()
            }
            "external-vm-network-name" | "externalvmnetworkname" => {
                n.external_vm_network_name = value.to_string()
            }
            "exclude-internal-network-subnet-cidr" | "excludeinternalnetworksubnetcidr" => {
                n.exclude_internal_network_subnet_cidr = parse_cidrs(&at, value)?
            }
            "exclude-external-network-subnet-cidr" | "excludeexternalnetworksubnetcidr" => {
                n.exclude_external_network_subnet_cidr = parse_cidrs(&at, value)?
            }
            _ => tracing::warn!(
                key,
                line,
                "vsphere cloud config: ignoring unknown key {place} {key}"
            ),
        }
        Ok(())
    }

    fn finish(mut self) -> Result<Self, ConfigError> {
        if !self.global.server.is_empty() && !self.vcenters.values().any(|v| v.server == self.global.server) {
            let mut vc = self.global.clone();
            vc.server = self.global.server.clone();
            self.vcenters.insert(self.global.server.clone(), vc);
        }
        for d in &self.dropped {
            tracing::warn!(section = %d.0, key = %d.1, "vsphere cloud config: ignoring in-tree key ({})", d.2);
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// Secret data from `(key, value)` pairs.
    fn d(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn yaml_is_tried_first() {
        let c = VsphereConfig::parse(Some(
            b"global:\n  user: admin\n  password: pw\n  insecureFlag: true\n  port: 8443\nvcenter:\n  vc1:\n    server: 10.0.0.1\n    datacenters: [DC0, DC1]\nlabels:\n  zone: k8s-zone\n  region: k8s-region\nnodes:\n  internalNetworkSubnetCidr: 10.0.0.0/24,10.1.0.0/24\n  excludeExternalNetworkSubnetCidr: [192.168.0.0/16]\nnsxt:\n  host: x\n",
        ))
        .unwrap()
        .apply_env(no_env)
        .unwrap();
        assert_eq!(c.format, Format::Yaml);
        let vc = &c.vcenters["vc1"];
        assert_eq!(
            (vc.server.as_str(), vc.port, vc.insecure, vc.user.as_str()),
            ("10.0.0.1", 8443, true, "admin")
        );
        assert_eq!(vc.password.expose(), "pw");
        assert_eq!(vc.datacenters, vec!["DC0", "DC1"]);
        assert_eq!(c.nodes.internal_network_subnet_cidr.len(), 2);
        assert_eq!(c.nodes.exclude_external_network_subnet_cidr.len(), 1);
        assert_eq!(
            (c.zone_category.as_str(), c.region_category.as_str()),
            ("k8s-zone", "k8s-region")
        );
        assert!(!format!("{c:?}").contains("pw\""), "no password in Debug");
    }

    #[test]
    fn in_tree_ini_with_dropped_keys() {
        let c = VsphereConfig::parse(Some(
            b"[Global]\nuser = \"admin@vsphere.local\"\npassword = \"s3cret\"\nport = 443\ninsecure-flag = 1\ndatacenter = DC0\ndatastore = ds1\nworking-dir = kubernetes\nvm-uuid = 4211\n\n[VirtualCenter \"10.0.0.1\"]\n\n[Network]\npublic-network = VM Network\n\n[Disk]\nscsicontrollertype = pvscsi\n\n[Workspace]\nserver = 10.0.0.1\ndatacenter = DC0\nfolder = kubernetes\ndefault-datastore = ds1\n\n[Labels]\nzone = k8s-zone\nregion = k8s-region\n",
        ))
        .unwrap()
        .apply_env(no_env)
        .unwrap();
        assert_eq!(c.format, Format::Ini);
        let vc = &c.vcenters["10.0.0.1"];
        assert_eq!(
            (vc.server.as_str(), vc.user.as_str(), vc.insecure),
            ("10.0.0.1", "admin@vsphere.local", true)
        );
        assert_eq!(vc.datacenters, vec!["DC0"]);
        let dropped: Vec<String> = c.dropped.iter().map(|d| format!("{} {}", d.0, d.1)).collect();
        for k in [
            "[Global] datastore",
            "[Global] working-dir",
            "[Global] vm-uuid",
            "[Disk] scsicontrollertype",
            "[Workspace] folder",
        ] {
            assert!(dropped.contains(&k.to_string()), "{k} not in {dropped:?}");
        }
    }

    #[test]
    fn errors_name_the_key_and_value() {
        let cases: Vec<(&[u8], &str)> = vec![
            (b"global:\n  port: 99999\n", "global: port: not a port number"),
            (
                b"global:\n  insecureFlag: maybe\n",
                "global: insecureFlag: not a boolean",
            ),
            (
                b"global:\n  ipFamily: [ipv5]\n",
                "global: ipFamily: every entry must be ipv4 or ipv6",
            ),
            (b"vcenter:\n  a:\n    user: x\n", "vcenter.a: server must be set"),
            (
                b"nodes:\n  internalNetworkSubnetCidr: 10.0.0.0/33\n",
                "nodes: internalNetworkSubnetCidr: entry 1 is not a CIDR",
            ),
            (
                b"[Global]\nsoap-roundtrip-count = many\n",
                "[Global] (line 2) soap-roundtrip-count: not a non-negative integer",
            ),
            (
                b"[VirtualCenter \"v\"]\nport = 0\n",
                "[VirtualCenter \"v\"] (line 2) port: not a port number",
            ),
            (
                b"[Nodes]\nexclude-internal-network-subnet-cidr = x\n",
                "exclude-internal-network-subnet-cidr: entry 1 is not a CIDR",
            ),
            (b"[Global\n", "line 1"),
            (
                b"global:\n  user: [a, b]\n",
                "global: user: must be a single value",
            ),
            (
                b"global:\n  password:\n    nested: x\n",
                "global: password: must be a single value",
            ),
            (b"labels: zone\n", "labels: must be a mapping"),
            (b"global:\n  user: a\n bad: - x\n", "not valid YAML"),
            (b"just a sentence\n", "neither a YAML mapping nor an INI file"),
            (b"[Global]\nuser\n", "[Global] (line 2) user: needs a value"),
            (b"[Labels]\nzone\n", "[Labels] (line 2) zone: needs a value"),
        ];
        for (input, expected) in cases {
            let e = VsphereConfig::parse(Some(input))
                .and_then(|c| c.apply_env(no_env))
                .unwrap_err()
                .to_string();
            for value in ["99999", "maybe", "ipv5", "10.0.0.0/33", "many", "hunter2"] {
                assert!(!e.contains(value), "no config value in errors: {e}");
            }
            assert!(
                e.contains(expected),
                "{}: expected {expected:?} in {e:?}",
                String::from_utf8_lossy(input)
            );
        }
        assert!(
            VsphereConfig::parse(None)
                .unwrap()
                .apply_env(no_env)
                .unwrap_err()
                .0
                .contains("no vCenter configured")
        );
    }

    #[test]
    fn unknown_sections_and_keys_warn_and_same_named_vcenters_merge() {
        let c = VsphereConfig::parse(Some(
            b"\xef\xbb\xbf[Global]\nuser = u\npassword = p\ninsecure-flag\nfuture-key = 1\n\
              [VirtualCenter \"vc1\"]\ndatacenters = DC0\n[Future]\nx = 1\n[Empty]\n\
              [VirtualCenter \"vc1\"]\nport = 8443\nfuture = 2\n[Labels]\nzone = z\nregion = r\nother = o\n",
        ))
        .unwrap()
        .apply_env(no_env)
        .unwrap();
        let vc = &c.vcenters["vc1"];
        assert_eq!((vc.port, vc.insecure), (8443, true), "bare insecure-flag is true");
        assert_eq!(
            vc.datacenters,
            vec!["DC0"],
            "the second [VirtualCenter \"vc1\"] merged"
        );
        assert_eq!((c.zone_category.as_str(), c.region_category.as_str()), ("z", "r"));
        let y = VsphereConfig::parse(Some(
            b"global:\n  server: vc\n  futureKey: 1\n  port: 8443\nlabels:\n  zone: z\n  region: r\n  other: o\nfutureSection:\n  a: 1\n",
        ))
        .unwrap()
        .apply_env(no_env)
        .unwrap();
        assert_eq!(y.vcenters["vc"].port, 8443);
        assert_eq!(y.zone_category, "z");
    }

    #[test]
    fn per_vcenter_environment_for_any_id_and_session_manager_keys() {
        let vars = [
            ("VSPHERE_VCENTER_PORT", "8443"),
            ("VSPHERE_VCENTER_prod-east", "vc-east"),
            ("VCENTER_prod-east_SERVER", "10.1.1.1"),
            ("VCENTER_prod-east_USERNAME", "u"),
            ("VSPHERE_VCENTER_77", "vc77"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let c = VsphereConfig::parse(None).unwrap().apply_env_from(vars).unwrap();
        assert_eq!(c.vcenters["vc-east"].server, "10.1.1.1");
        assert_eq!(c.vcenters["vc-east"].port, 8443);
        assert_eq!(c.vcenters["vc77"].server, "vc77");
        let c = credentials_from_secret(&d(&[
            ("vc.username", "a"),
            ("vc.password", "b"),
            ("vc.vc-session-manager-url", "https://sm/token"),
            ("vc.vc-session-manager-token", "t"),
        ]))
        .unwrap();
        assert_eq!(c["vc"].0, "a");
        let in_tree = VsphereConfig::parse(Some(
            b"[Global]\nserver = vc\nuser = u\npassword = p\n[Network]\npublic-network = VM Network\n",
        ))
        .unwrap();
        assert_eq!(in_tree.nodes.internal_vm_network_name, "VM Network");
        assert_eq!(in_tree.nodes.external_vm_network_name, "VM Network");
    }

    #[test]
    fn environment_overrides_without_inverted_checks() {
        let env = |k: &str| {
            Some(
                match k {
                    "VSPHERE_VCENTER" => "vc.example.com",
                    "VSPHERE_USER" => "u",
                    "VSPHERE_PASSWORD" => "p",
                    "VSPHERE_INSECURE" => "true",
                    "VSPHERE_ROUNDTRIP_COUNT" => "5",
                    "VSPHERE_VCENTER_1" => "second",
                    "VCENTER_1_SERVER" => "10.9.9.9",
                    "VCENTER_1_INSECURE" => "true",
                    "VCENTER_1_IP_FAMILY" => "ipv6,ipv4",
                    "ENABLE_ALPHA_DUAL_STACK" => "true",
                    _ => return None,
                }
                .to_string(),
            )
        };
        let c = VsphereConfig::parse(None).unwrap().apply_env(env).unwrap();
        let g = &c.vcenters["vc.example.com"];
        assert!(g.insecure && g.soap_roundtrip_count == 5);
        let s = &c.vcenters["second"];
        assert_eq!(s.server, "10.9.9.9");
        assert!(s.insecure, "VCENTER_<ID>_INSECURE is honoured");
        assert_eq!(s.ip_family, vec!["ipv6", "ipv4"]);
        let without_gate = |k: &str| {
            if k == "ENABLE_ALPHA_DUAL_STACK" {
                None
            } else {
                env(k)
            }
        };
        assert!(
            VsphereConfig::parse(None)
                .unwrap()
                .apply_env(without_gate)
                .unwrap_err()
                .0
                .contains("ENABLE_ALPHA_DUAL_STACK")
        );
    }

    #[test]
    fn secret_key_forms() {
        let c = credentials_from_secret(&d(&[
            ("10.0.0.1.username", "a\n"),
            ("10.0.0.1.password", "b\n"),
            ("server_v6", "fd00::1"),
            ("username_v6", "c"),
            ("password_v6", "e"),
        ]))
        .unwrap();
        assert_eq!(c["10.0.0.1"].0, "a");
        assert_eq!(c["10.0.0.1"].1.expose(), "b");
        assert_eq!(c["fd00::1"].0, "c");
        assert!(
            credentials_from_secret(&d(&[("x.username", "a")]))
                .unwrap_err()
                .0
                .contains("x.username has no matching password")
        );
        assert!(
            credentials_from_secret(&d(&[("token", "a")]))
                .unwrap_err()
                .0
                .contains("unknown key \"token\"")
        );
    }
}

#[cfg(test)]
mod golden {
    use super::*;

    /// Converts `testdata/<name>.conf` and compares with `testdata/<name>.yaml` (set
    /// `UPDATE_GOLDEN=1` to rewrite the expected files). The YAML must also read back to the
    /// same vCenters, labels and node settings.
    fn check(name: &str) {
        // Read when the test runs first: a shared build cache may hold a binary compiled in
        // a checkout at another path.
        let dir = std::env::var_os("CARGO_MANIFEST_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
            .join("testdata");
        let input = std::fs::read(dir.join(format!("{name}.conf"))).unwrap();
        let cfg = VsphereConfig::parse(Some(&input))
            .unwrap()
            .apply_env(|_| None)
            .unwrap();
        let yaml = to_cpi_yaml(&cfg);
        let golden = dir.join(format!("{name}.yaml"));
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&golden, &yaml).unwrap();
        }
        assert_eq!(
            yaml,
            std::fs::read_to_string(&golden).unwrap(),
            "golden file {} differs",
            golden.display()
        );
        let back = VsphereConfig::parse(Some(yaml.as_bytes()))
            .unwrap()
            .apply_env(|_| None)
            .unwrap();
        assert_eq!(back.format, Format::Yaml);
        assert_eq!(back.vcenters, cfg.vcenters, "vCenters survive the conversion");
        assert_eq!(
            (back.zone_category.clone(), back.region_category.clone()),
            (cfg.zone_category.clone(), cfg.region_category.clone())
        );
        assert_eq!(back.nodes, cfg.nodes);
    }

    #[test]
    fn in_tree_ini() {
        check("in-tree");
    }

    #[test]
    fn cpi_ini() {
        check("cpi");
    }
}
