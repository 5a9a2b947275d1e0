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

/// An INI entry's value and how it was written.
fn ini_value(e: &gcfg::Entry) -> (Value, Written) {
    match &e.value {
        Some(v) => (Value::String(v.clone()), Written::Valued),
        None => (Value::Null, Written::Bare),
    }
}

/// In-tree `[Global]` keys the CPI dropped, and why.
fn dropped_global_key(key: &str) -> Option<&'static str> {
    Some(match key.to_ascii_lowercase().as_str() {
        "datastore" => "volumes are the vSphere CSI driver's job",
        "working-dir" => "volumes are the vSphere CSI driver's job",
        "vm-uuid" => "the CCM finds nodes by their providerID/systemUUID",
        "vm-name" => "the CCM finds nodes by their providerID/systemUUID",
        "secret-not-managed" => "secrets are always read, never managed",
        "api-disable" | "api-binding" => "the CPI's gRPC API was removed",
        _ => return None,
    })
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

    fn from_ini(text: &str) -> Result<Self, ConfigError> {
        let sections = gcfg::parse(text).map_err(|e| ConfigError(format!("neither YAML nor INI: {e}")))?;
        let mut cfg = Self {
            format: Format::Ini,
            ..Self::default()
        };
        // [Global] first: [VirtualCenter] sections inherit from it.
        for s in sections
            .iter()
            .filter(|s| s.is("Global") && s.subsection.is_none())
        {
            for e in &s.entries {
                let (value, written) = ini_value(e);
                let lower = e.key.to_ascii_lowercase();
                if lower == "secrets-directory" {
                    cfg.secrets_directory = e.value.clone().unwrap_or_default();
                } else if lower == "datacenter" {
                    cfg.dropped.push((
                        "[Global]".into(),
                        e.key.clone(),
                        "deprecated: written as datacenters".into(),
                    ));
                    if cfg.global.datacenters.is_empty() {
                        cfg.global.datacenters = split_list(e.value.as_deref().unwrap_or_default());
                    }
                } else if let Some(why) = dropped_global_key(&e.key) {
                    cfg.dropped.push(("[Global]".into(), e.key.clone(), why.into()));
                } else if !apply_vcenter_key(
                    &mut cfg.global,
                    &format!("[Global] (line {})", e.line),
                    &e.key,
                    &value,
                    written,
                )? {
                    tracing::warn!(key = %e.key, line = e.line, "vsphere cloud config: ignoring unknown key in [Global]");
                }
            }
        }
        for s in &sections {
            let name = s.display_name();
            if s.is("Global") && s.subsection.is_none() {
                continue;
            }
            if s.is("VirtualCenter") && s.subsection.is_some() {
                let label = s.subsection.clone().unwrap_or_default();
                // Same-named sections fill one entry, as gcfg's map does.
                let mut vc = cfg.vcenters.remove(&label).unwrap_or_else(|| VCenterConfig {
                    server: label.clone(),
                    ..cfg.global.clone()
                });
                for e in &s.entries {
                    let (value, written) = ini_value(e);
                    if !apply_vcenter_key(
                        &mut vc,
                        &format!("{name} (line {})", e.line),
                        &e.key,
                        &value,
                        written,
                    )? {
                        tracing::warn!(section = %name, key = %e.key, line = e.line, "vsphere cloud config: ignoring unknown key");
                    }
                }
                cfg.vcenters.insert(label, vc);
                continue;
            }
            let lower = s.name.to_ascii_lowercase();
            let known_section = s.subsection.is_none()
                && matches!(
                    lower.as_str(),
                    "labels"
                        | "nodes"
                        | "network"
                        | "disk"
                        | "workspace"
                        | "nsxt"
                        | "loadbalancer"
                        | "loadbalancerclass"
                        | "route"
                );
            if !known_section {
                tracing::warn!(section = %name, line = s.line, "vsphere cloud config: ignoring unknown section");
                continue;
            }
            for e in &s.entries {
                let v = e.value.clone().unwrap_or_default();
                match lower.as_str() {
                    "labels" => match e.key.to_ascii_lowercase().as_str() {
                        "zone" | "region" if e.value.is_none() => {
                            return Err(ConfigError(format!(
                                "{name} (line {}) {}: needs a value",
                                e.line, e.key
                            )));
                        }
                        "zone" => cfg.zone_category = v,
                        "region" => cfg.region_category = v,
                        _ => {
                            tracing::warn!(key = %e.key, line = e.line, "vsphere cloud config: ignoring unknown key in [Labels]")
                        }
                    },
                    "nodes" => {
                        cfg.apply_nodes_key(&format!("{name} (line {})", e.line), &e.key, &v, Some(e.line))?
                    }
                    // In-tree: node IPs come from the VM's NICs on this network, as both
                    // InternalIP and ExternalIP: the CPI's internal and external network names.
                    "network" if e.key.eq_ignore_ascii_case("public-network") && !v.is_empty() => {
                        if cfg.nodes.internal_vm_network_name.is_empty() {
                            cfg.nodes.internal_vm_network_name = v.clone();
                        }
                        if cfg.nodes.external_vm_network_name.is_empty() {
                            cfg.nodes.external_vm_network_name = v.clone();
                        }
                    }
                    "network" => cfg.dropped.push((
                        name.clone(),
                        e.key.clone(),
                        "node IPs are chosen by [Nodes] (internal-vm-network-name)".into(),
                    )),
                    "disk" | "workspace" => cfg.dropped.push((
                        name.clone(),
                        e.key.clone(),
                        "volumes are the vSphere CSI driver's job".into(),
                    )),
                    _ => cfg.dropped.push((
                        name.clone(),
                        e.key.clone(),
                        "NSX-T load balancers and routes are not supported".into(),
                    )),
                }
            }
        }
        cfg.finish()
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

    /// Applies the process environment ([`VsphereConfig::apply_env_from`] over
    /// `std::env::vars`).
    pub fn apply_process_env(self) -> Result<Self, ConfigError> {
        self.apply_env_from(std::env::vars())
    }

    /// Applies environment overrides from a list of variables (every `VSPHERE_VCENTER_<ID>`
    /// among them, whatever the ID), then checks that at least one vCenter is configured.
    pub fn apply_env_from(
        self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let vars: BTreeMap<String, String> = vars.into_iter().collect();
        let ids: Vec<String> = vars
            .keys()
            .filter_map(|k| k.strip_prefix("VSPHERE_VCENTER_"))
            .filter(|id| !id.is_empty() && *id != "PORT")
            .map(str::to_string)
            .collect();
        self.apply_env_with_ids(|k| vars.get(k).cloned(), ids)
    }

    /// Applies environment overrides (from `get`, e.g. `|k| std::env::var(k).ok()`; per-vCenter
    /// variables for the IDs 1 to 32), then checks that at least one vCenter is configured.
    pub fn apply_env(self, get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        self.apply_env_with_ids(get, (1..=32).map(|i| i.to_string()).collect())
    }

    fn apply_env_with_ids(
        mut self,
        get: impl Fn(&str) -> Option<String>,
        vcenter_ids: Vec<String>,
    ) -> Result<Self, ConfigError> {
        let g = &mut self.global;
        let env = |k: &str| get(k).filter(|v| !v.is_empty());
        if let Some(v) = env("VSPHERE_VCENTER") {
            g.server = v;
        }
        if let Some(v) = env("VSPHERE_VCENTER_PORT") {
            g.port = parse_port("VSPHERE_VCENTER_PORT", &v)?;
        }
        if let Some(v) = env("VSPHERE_USER") {
            g.user = v;
        }
        if let Some(v) = env("VSPHERE_PASSWORD") {
            g.password = Secret::new(v);
        }
        if let Some(v) = env("VSPHERE_DATACENTER") {
            g.datacenters = split_list(&v);
        }
        if let Some(v) = env("VSPHERE_SECRET_NAME") {
            g.secret_name = v;
        }
        if let Some(v) = env("VSPHERE_SECRET_NAMESPACE") {
            g.secret_namespace = v;
        }
        if let Some(v) = env("VSPHERE_ROUNDTRIP_COUNT") {
            g.soap_roundtrip_count = parse_u32("VSPHERE_ROUNDTRIP_COUNT", &v)?;
        }
        if let Some(v) = env("VSPHERE_INSECURE") {
            g.insecure = parse_bool("VSPHERE_INSECURE", &v)?;
        }
        if let Some(v) = env("VSPHERE_CAFILE") {
            g.ca_file = v;
        }
        if let Some(v) = env("VSPHERE_THUMBPRINT") {
            g.thumbprint = v;
        }
        if let Some(v) = env("VSPHERE_SECRETS_DIRECTORY") {
            self.secrets_directory = v;
        }
        if let Some(v) = env("VSPHERE_LABEL_REGION") {
            self.region_category = v;
        }
        if let Some(v) = env("VSPHERE_LABEL_ZONE") {
            self.zone_category = v;
        }
        for (var, key) in [
            (
                "VSPHERE_NODES_INTERNAL_NETWORK_SUBNET_CIDR",
                "internal-network-subnet-cidr",
            ),
            (
                "VSPHERE_NODES_EXTERNAL_NETWORK_SUBNET_CIDR",
                "external-network-subnet-cidr",
            ),
            (
                "VSPHERE_NODES_INTERNAL_VM_NETWORK_NAME",
                "internal-vm-network-name",
            ),
            (
                "VSPHERE_NODES_EXTERNAL_VM_NETWORK_NAME",
                "external-vm-network-name",
            ),
        ] {
            if let Some(v) = env(var) {
                self.apply_nodes_key(var, key, &v, None)?;
            }
        }
        // Per-vCenter: VSPHERE_VCENTER_<ID>=<name> with VCENTER_<ID>_<KEY>, for any <ID>
        // (`VSPHERE_VCENTER_PORT` is the global port, not an ID).
        for id in vcenter_ids {
            let Some(name) = env(&format!("VSPHERE_VCENTER_{id}")) else {
                continue;
            };
            let mut vc = self.vcenters.remove(&name).unwrap_or_else(|| VCenterConfig {
                server: name.clone(),
                ..self.global.clone()
            });
            for (suffix, key) in [
                ("USERNAME", "user"),
                ("PASSWORD", "password"),
                ("SERVER", "server"),
                ("PORT", "port"),
                ("INSECURE", "insecure-flag"),
                ("DATACENTERS", "datacenters"),
                ("ROUNDTRIP", "soap-roundtrip-count"),
                ("CAFILE", "ca-file"),
                ("THUMBPRINT", "thumbprint"),
                ("SECRET_NAME", "secret-name"),
                ("SECRET_NAMESPACE", "secret-namespace"),
                ("IP_FAMILY", "ip-family"),
            ] {
                let var = format!("VCENTER_{id}_{suffix}");
                if let Some(v) = env(&var) {
                    apply_vcenter_key(&mut vc, &var, key, &Value::String(v), Written::Valued)?;
                }
            }
            self.vcenters.insert(name, vc);
        }
        let mut cfg = self.finish()?;
        if cfg.vcenters.is_empty() {
            return Err(ConfigError(
                "no vCenter configured: set global.server or a vcenter entry (or VSPHERE_VCENTER)".into(),
            ));
        }
        let dual_stack = get("ENABLE_ALPHA_DUAL_STACK").is_some();
        for (name, vc) in &cfg.vcenters {
            if vc.server.is_empty() {
                return Err(ConfigError(format!("vcenter {name}: server must be set")));
            }
            // Upstream's gate: dual-stack node addresses are alpha.
            if vc.ip_family.len() > 1 && !dual_stack {
                return Err(ConfigError(format!(
                    "vcenter {name}: ipFamily names two families (dual-stack), which needs the environment variable ENABLE_ALPHA_DUAL_STACK set"
                )));
            }
        }
        if cfg.zone_category.is_empty() != cfg.region_category.is_empty() {
            tracing::warn!(
                "vsphere cloud config: zones are reported only when both labels.zone and labels.region are set"
            );
        }
        cfg.dropped.sort();
        cfg.dropped.dedup();
        Ok(cfg)
    }
}

/// Credentials per vCenter server from a Secret's data or a secrets directory's files:
/// `<server>.username` / `<server>.password`, or `server_<id>` / `username_<id>` /
/// `password_<id>` (trailing newlines trimmed). The shared-session keys
/// `<server>.vc-session-manager-url` / `<server>.vc-session-manager-token` (VS-22) are accepted
/// and ignored with a warning: this provider logs in with the user and password, so a server
/// with only session-manager keys is an error. An unknown key or a user without a password is
/// an error naming the key (never a value).
pub fn credentials_from_secret(
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<BTreeMap<String, (String, Secret)>, ConfigError> {
    let text = |k: &str| {
        String::from_utf8_lossy(&data[k])
            .trim_end_matches(['\n', '\r'])
            .to_string()
    };
    let mut users: BTreeMap<String, String> = BTreeMap::new();
    let mut passwords: BTreeMap<String, Secret> = BTreeMap::new();
    let mut ids: BTreeMap<String, String> = BTreeMap::new();
    for key in data.keys() {
        if let Some(server) = key.strip_suffix(".username") {
            users.insert(server.to_string(), text(key));
        } else if let Some(server) = key.strip_suffix(".password") {
            passwords.insert(server.to_string(), Secret::new(text(key)));
        } else if let Some(id) = key.strip_prefix("server_") {
            ids.insert(id.to_string(), text(key));
        } else if key.starts_with("username_") || key.starts_with("password_") {
        } else if let Some(server) = key
            .strip_suffix(".vc-session-manager-url")
            .or_else(|| key.strip_suffix(".vc-session-manager-token"))
        {
            tracing::warn!(
                server,
                key = %key,
                "vsphere credentials: the shared session manager is not supported; logging in with <server>.username/.password"
            );
        } else {
            return Err(ConfigError(format!(
                "credentials secret: unknown key {key:?} (expected <server>.username, <server>.password, server_<id>, username_<id>, password_<id>)"
            )));
        }
    }
    for (id, server) in ids {
        if let Some(u) = data.get(&format!("username_{id}")) {
            users.insert(server.clone(), String::from_utf8_lossy(u).trim_end().to_string());
        }
        if let Some(p) = data.get(&format!("password_{id}")) {
            passwords.insert(
                server.clone(),
                Secret::new(String::from_utf8_lossy(p).trim_end().to_string()),
            );
        }
    }
    let mut out = BTreeMap::new();
    for (server, user) in users {
        let password = passwords.remove(&server).ok_or_else(|| {
            ConfigError(format!(
                "credentials secret: {server}.username has no matching password"
            ))
        })?;
        out.insert(server, (user, password));
    }
    Ok(out)
}

/// Reads a secrets directory (files named like Secret keys).
pub fn credentials_from_directory(
    dir: &std::path::Path,
) -> Result<BTreeMap<String, (String, Secret)>, ConfigError> {
    let mut data = BTreeMap::new();
    let entries = std::fs::read_dir(dir)
        .map_err(|e| ConfigError(format!("secrets directory {}: {e}", dir.display())))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_file()
            && let Some(name) = path.file_name().and_then(|n| n.to_str())
            && !name.starts_with('.')
        {
            let bytes = std::fs::read(&path)
                .map_err(|e| ConfigError(format!("secrets directory file {}: {e}", path.display())))?;
            data.insert(name.to_string(), bytes);
        }
    }
    credentials_from_secret(&data)
}

fn yaml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Writes the CPI YAML for a configuration read from an in-tree or CPI INI file, with a comment
/// for every in-tree key that was dropped (the converter upstream's vcpctl promised).
pub fn to_cpi_yaml(cfg: &VsphereConfig) -> String {
    let mut y =
        String::from("# vSphere cloud-provider configuration (CPI YAML), converted from an INI file.\n");
    if !cfg.dropped.is_empty() {
        y.push_str("# In-tree settings that have no equivalent and were dropped:\n");
        for (section, key, why) in &cfg.dropped {
            y.push_str(&format!("#   {section} {key}: {why}\n"));
        }
    }
    let vc_fields =
        |y: &mut String, vc: &VCenterConfig, indent: &str, with_server: bool, defaults: &VCenterConfig| {
            if with_server {
                y.push_str(&format!("{indent}server: {}\n", yaml_str(&vc.server)));
            }
            if !vc.user.is_empty() && (!with_server || vc.user != defaults.user) {
                y.push_str(&format!("{indent}user: {}\n", yaml_str(&vc.user)));
            }
            if !vc.password.is_empty() && (!with_server || vc.password != defaults.password) {
                y.push_str(&format!("{indent}password: {}\n", yaml_str(vc.password.expose())));
            }
            if vc.port != 443 && (!with_server || vc.port != defaults.port) {
                y.push_str(&format!("{indent}port: {}\n", vc.port));
            }
            if (!with_server && vc.insecure) || (with_server && vc.insecure != defaults.insecure) {
                y.push_str(&format!("{indent}insecureFlag: {}\n", vc.insecure));
            }
            if !vc.datacenters.is_empty() && (!with_server || vc.datacenters != defaults.datacenters) {
                y.push_str(&format!("{indent}datacenters:\n"));
                for d in &vc.datacenters {
                    y.push_str(&format!("{indent}  - {}\n", yaml_str(d)));
                }
            }
            if vc.soap_roundtrip_count != 3
                && (!with_server || vc.soap_roundtrip_count != defaults.soap_roundtrip_count)
            {
                y.push_str(&format!(
                    "{indent}soapRoundtripCount: {}\n",
                    vc.soap_roundtrip_count
                ));
            }
            for (key, value, default) in [
                ("caFile", &vc.ca_file, &defaults.ca_file),
                ("thumbprint", &vc.thumbprint, &defaults.thumbprint),
                ("secretName", &vc.secret_name, &defaults.secret_name),
                (
                    "secretNamespace",
                    &vc.secret_namespace,
                    &defaults.secret_namespace,
                ),
            ] {
                if !value.is_empty() && (!with_server || value != default) {
                    y.push_str(&format!("{indent}{key}: {}\n", yaml_str(value)));
                }
            }
            if vc.ip_family != vec!["ipv4".to_string()]
                && (!with_server || vc.ip_family != defaults.ip_family)
            {
                y.push_str(&format!("{indent}ipFamily:\n"));
                for f in &vc.ip_family {
                    y.push_str(&format!("{indent}  - {f}\n"));
                }
            }
        };
    y.push_str("global:\n");
    let empty = default_vcenter();
    vc_fields(&mut y, &cfg.global, "  ", false, &empty);
    if !cfg.secrets_directory.is_empty() {
        y.push_str(&format!(
            "  secretsDirectory: {}\n",
            yaml_str(&cfg.secrets_directory)
        ));
    }
    y.push_str("vcenter:\n");
    for (name, vc) in &cfg.vcenters {
        y.push_str(&format!("  {}:\n", yaml_str(name)));
        vc_fields(&mut y, vc, "    ", true, &cfg.global);
    }
    if !cfg.zone_category.is_empty() || !cfg.region_category.is_empty() {
        y.push_str("labels:\n");
        if !cfg.zone_category.is_empty() {
            y.push_str(&format!("  zone: {}\n", yaml_str(&cfg.zone_category)));
        }
        if !cfg.region_category.is_empty() {
            y.push_str(&format!("  region: {}\n", yaml_str(&cfg.region_category)));
        }
    }
    let n = &cfg.nodes;
    let cidrs = |v: &Vec<IpNet>| v.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",");
    let node_fields = [
        (
            "internalNetworkSubnetCidr",
            cidrs(&n.internal_network_subnet_cidr),
        ),
        (
            "externalNetworkSubnetCidr",
            cidrs(&n.external_network_subnet_cidr),
        ),
        ("internalVmNetworkName", n.internal_vm_network_name.clone()),
        ("externalVmNetworkName", n.external_vm_network_name.clone()),
        (
            "excludeInternalNetworkSubnetCidr",
            cidrs(&n.exclude_internal_network_subnet_cidr),
        ),
        (
            "excludeExternalNetworkSubnetCidr",
            cidrs(&n.exclude_external_network_subnet_cidr),
        ),
    ];
    if node_fields.iter().any(|(_, v)| !v.is_empty()) {
        y.push_str("nodes:\n");
        for (k, v) in node_fields {
            if !v.is_empty() {
                y.push_str(&format!("  {k}: {}\n", yaml_str(&v)));
            }
        }
    }
    y
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
