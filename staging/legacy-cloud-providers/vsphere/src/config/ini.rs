//! The INI form of the configuration (gcfg: in-tree `vsphere.conf` and the CPI's INI),
//! with the in-tree keys the CPI dropped named in a warning.

use super::*;

/// An INI entry's value and how it was written.
pub(crate) fn ini_value(e: &gcfg::Entry) -> (Value, Written) {
    match &e.value {
        Some(v) => (Value::String(v.clone()), Written::Valued),
        None => (Value::Null, Written::Bare),
    }
}

/// In-tree `[Global]` keys the CPI dropped, and why.
pub(crate) fn dropped_global_key(key: &str) -> Option<&'static str> {
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
    pub(crate) fn from_ini(text: &str) -> Result<Self, ConfigError> {
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
}
