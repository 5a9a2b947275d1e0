//! The `--cloud-config` file, in the INI dialect of Go's `gcfg` that upstream providers use
//! (read with the framework's `k8s_cloud_provider::gcfg`):
//!
//! ```ini
//! [Global]
//! ; The machine inventory, a JSON file (relative paths are relative to the working directory).
//! inventory = /etc/sample/machines.json
//! ; Optional: the Secret (namespace/name) whose key `token` the inventory must accept.
//! credentials-secret = kube-system/sample-cloud
//!
//! [LoadBalancer]
//! ; Optional: the addresses load balancers get (first-last, IPv4). Without it, the provider
//! ; has no load balancers.
//! address-pool = 192.0.2.10-192.0.2.19
//! ```
//!
//! An unknown section or key is reported as a warning (as `gcfg.FatalOnly` does upstream); a
//! syntax error, a missing `inventory` or a bad value is an error naming the line and the value.

use std::{net::Ipv4Addr, path::PathBuf};

use k8s_cloud_provider::gcfg;

/// The parsed cloud config.
#[derive(Debug, Clone, PartialEq)]
pub struct CloudConfig {
    /// `[Global] inventory`.
    pub inventory: PathBuf,
    /// `[Global] credentials-secret`, as (namespace, name).
    pub credentials_secret: Option<(String, String)>,
    /// `[LoadBalancer] address-pool`, as (first, last).
    pub address_pool: Option<(Ipv4Addr, Ipv4Addr)>,
}

impl CloudConfig {
    /// Parses the file's text; `Err` names the line and the value at fault.
    pub fn parse(text: &str) -> Result<Self, String> {
        let sections = gcfg::parse(text).map_err(|e| format!("--cloud-config: {e}"))?;
        let mut inventory = None;
        let mut credentials_secret = None;
        let mut address_pool = None;
        for section in &sections {
            for entry in &section.entries {
                let at = format!(
                    "--cloud-config line {}: {} {}",
                    entry.line,
                    section.display_name(),
                    entry.key
                );
                let value = entry.value.as_deref().unwrap_or("").trim();
                match (
                    section.name.to_ascii_lowercase().as_str(),
                    entry.key.to_ascii_lowercase().as_str(),
                ) {
                    ("global", "inventory") if !value.is_empty() => {
                        inventory = Some(PathBuf::from(value))
                    }
                    ("global", "inventory") => {
                        return Err(format!("{at}: must name the inventory file"));
                    }
                    ("global", "credentials-secret") => {
                        let (namespace, name) = value
                            .split_once('/')
                            .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/'))
                            .ok_or_else(|| format!("{at}: {value:?} is not <namespace>/<name>"))?;
                        credentials_secret = Some((namespace.to_string(), name.to_string()));
                    }
                    ("loadbalancer", "address-pool") => {
                        let range = value.split_once('-').and_then(|(first, last)| {
                            Some((
                                first.trim().parse::<Ipv4Addr>().ok()?,
                                last.trim().parse::<Ipv4Addr>().ok()?,
                            ))
                        });
                        match range {
                            Some((first, last)) if first <= last => {
                                address_pool = Some((first, last))
                            }
                            _ => {
                                return Err(format!(
                                    "{at}: {value:?} is not <first IPv4>-<last IPv4>"
                                ));
                            }
                        }
                    }
                    _ => eprintln!("warning: {at}: unknown key, ignored"),
                }
            }
        }
        Ok(Self {
            inventory: inventory.ok_or("--cloud-config: [Global] inventory is missing")?,
            credentials_secret,
            address_pool,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_config_parses_and_bad_values_name_their_line() {
        let config = CloudConfig::parse(
            "[Global]\ninventory = m.json\ncredentials-secret = kube-system/sample\n\n[LoadBalancer]\naddress-pool = 192.0.2.10-192.0.2.11\n",
        )
        .unwrap();
        assert_eq!(config.inventory, PathBuf::from("m.json"));
        assert_eq!(
            config.credentials_secret,
            Some(("kube-system".into(), "sample".into()))
        );
        assert_eq!(
            config.address_pool,
            Some(("192.0.2.10".parse().unwrap(), "192.0.2.11".parse().unwrap()))
        );
        let e = CloudConfig::parse(
            "[Global]\ninventory = m.json\n[LoadBalancer]\naddress-pool = 10.0.0.9-10.0.0.1\n",
        )
        .unwrap_err();
        assert!(
            e.contains("line 4") && e.contains("10.0.0.9-10.0.0.1"),
            "{e}"
        );
        assert!(
            CloudConfig::parse("[Global]\n")
                .unwrap_err()
                .contains("inventory is missing")
        );
        assert!(
            CloudConfig::parse("[Global]\ncredentials-secret = nope\ninventory = m\n")
                .unwrap_err()
                .contains("\"nope\"")
        );
    }
}
