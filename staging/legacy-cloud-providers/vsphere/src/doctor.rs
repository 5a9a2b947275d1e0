//! The vSphere part of `cloud-controller-manager-vsphere doctor`: for every vCenter of the
//! cloud config, that its credentials log in, which datacenters the account sees, and that it
//! holds the read privileges the CCM needs on them; then that every Node's VM is found.

use k8s_cloud_provider::{
    CloudError, InstancesV2,
    doctor::Check,
    node::helpers::{node_name, provider_id},
};
use k8s_openapi::api::core::v1::Node;

use crate::VsphereCloud;

/// The privileges the CCM uses on a datacenter and the VMs under it: it only reads the
/// inventory (VMs, hosts, clusters, folders) and the tags of zones.
pub const REQUIRED_PRIVILEGES: &[&str] = &["System.Anonymous", "System.Read", "System.View"];

impl VsphereCloud {
    /// The vSphere checks of `doctor` for the cluster's `nodes` (see the module docs). Never
    /// prints a password: errors of the vSphere bindings carry none.
    pub async fn doctor(&self, nodes: &[Node]) -> Vec<Check> {
        let mut checks = Vec::new();
        let mut reachable = 0;
        for (i, vc) in self.vcenters.iter().enumerate() {
            let label = &vc.label;
            let soap = match self.clients(i).await {
                Ok((soap, _)) => soap.clone(),
                Err(e) => {
                    checks.push(Check::fail(
                        format!("vcenter {label}: connection"),
                        format!("{e} (fix: server, port, TLS settings (ca-file, thumbprint, insecure-flag) of vcenter {label})"),
                    ));
                    continue;
                }
            };
            let user = match soap.login().await {
                Ok(()) => soap
                    .current_user()
                    .await
                    .unwrap_or_else(|_| vc.config.user.clone()),
                Err(e) => {
                    checks.push(Check::fail(
                        format!("vcenter {label}: login"),
                        format!(
                            "{e} (fix: the user and password of vcenter {label}: in the cloud config, its secrets directory or the Secret it names)"
                        ),
                    ));
                    continue;
                }
            };
            checks.push(Check::pass(
                format!("vcenter {label}: login"),
                format!("logged in to {}:{} as {user}", vc.config.server, vc.config.port),
            ));
            let datacenters = match self.datacenters(i).await {
                Ok(d) => d,
                Err(e) => {
                    checks.push(Check::fail(
                        format!("vcenter {label}: datacenters"),
                        format!("{e} (fix: the datacenters of vcenter {label} in the cloud config, or the account's permissions)"),
                    ));
                    continue;
                }
            };
            reachable += 1;
            checks.push(Check::pass(
                format!("vcenter {label}: datacenters"),
                format!(
                    "{} searched: {}",
                    datacenters.len(),
                    datacenters
                        .iter()
                        .map(|d| d.value.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
            let name = format!("vcenter {label}: privileges");
            match soap.user_privileges(&datacenters, &user).await {
                Ok(granted) => {
                    let missing: Vec<String> = datacenters
                        .iter()
                        .flat_map(|dc| {
                            let held = granted
                                .iter()
                                .find(|(e, _)| e == dc)
                                .map(|(_, p)| p.as_slice())
                                .unwrap_or_default();
                            REQUIRED_PRIVILEGES
                                .iter()
                                .filter(move |p| !held.iter().any(|h| h == *p))
                                .map(move |p| format!("{p} on {}", dc.value))
                        })
                        .collect();
                    if missing.is_empty() {
                        checks.push(Check::pass(
                            name,
                            format!("{} on every datacenter", REQUIRED_PRIVILEGES.join(", ")),
                        ));
                    } else {
                        checks.push(Check::fail(
                            name,
                            format!(
                                "{user} lacks {} (fix: give {user} a role with the Read-only privileges on the datacenters, propagated to their children)",
                                missing.join(", ")
                            ),
                        ));
                    }
                }
                Err(e) => checks.push(Check::warn(name, format!("could not ask vCenter: {e}"))),
            }
        }
        if reachable == 0 {
            // Without a vCenter no Node can be looked up; every Node line would only repeat it.
            return checks;
        }
        for node in nodes {
            let name = format!("node {}", node_name(node));
            let id = provider_id(node);
            match (!id.is_empty()).then_some(id) {
                Some(id) => match self.instance_exists(node).await {
                    Ok(true) => checks.push(Check::pass(name, format!("VM {id} found"))),
                    Ok(false) => checks.push(Check::fail(
                        name,
                        format!(
                            "VM {id} not found in any vCenter and datacenter of the cloud config: the node-lifecycle controller will delete this Node (fix: its providerID, or the vCenters/datacenters of the cloud config)"
                        ),
                    )),
                    Err(e) => checks.push(Check::warn(name, format!("could not look up {id}: {e}"))),
                },
                None => match self.instance_metadata(node).await {
                    Ok(Some(m)) => checks.push(Check::pass(
                        name,
                        format!("not initialised yet; its VM is found: it will get providerID {}", m.provider_id),
                    )),
                    Ok(None) | Err(CloudError::InstanceNotFound) => checks.push(Check::fail(
                        name,
                        "not initialised and no VM is found by its system UUID or name: the cloud-node controller cannot initialise it (fix: the VM's guest host name or the Node's systemUUID, or the vCenters/datacenters of the cloud config)",
                    )),
                    Err(e) => checks.push(Check::warn(name, format!("could not look up its VM: {e}"))),
                },
            }
        }
        checks
    }
}
