//! Environment overrides (`VSPHERE_*`, as the CPI reads them), per vCenter for any ID.

use super::*;

impl VsphereConfig {
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

    pub(crate) fn apply_env_with_ids(
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
