//! The configuration written back as the CPI's YAML (`convert-config`).

use super::*;

pub(crate) fn yaml_str(s: &str) -> String {
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
