//! The staged vSphere cloud provider (the counterpart of `legacy-cloud-providers/vsphere` and
//! of `cloud-provider-vsphere`'s CPI), on the [`vsphere_api`] bindings.
//!
//! Implemented (spec Part B, newest CPI behaviour): the config ([`config`], B1: YAML with
//! scalars kept as written, CPI INI, in-tree INI, environment, Secret / secrets-directory
//! credentials), `InstancesV2` (VS-01…18): look-up by system UUID in both byte orders, then
//! guest DNS name (ambiguity is an error), then IP; provider IDs `vsphere://<uuid>`; addresses
//! by VS-08…10 with cloud-init's static addresses first (VS-09, [`guestinfo`]); upstream's
//! instance-type names (VS-12, [`guest_os`]); zone/region from tag categories walking host →
//! resource pool → VM with their ancestors, in one PropertyCollector traversal and one bulk
//! tag read. One SOAP and one REST session per vCenter, reused by every look-up, logged out on
//! shutdown.
//!
//! **A Node is reported gone only on positive proof**: a search that covered every configured
//! vCenter and datacenter without an error and found nothing (and, for a VM seen before,
//! `ManagedObjectNotFound` on its reference). A vCenter that fails, an account that sees no
//! datacenter, an empty property answer for a known VM (not visible to the account), rejected
//! credentials, or a malformed providerID / `systemUUID` are errors: the node-lifecycle
//! controller keeps the Node and says why (cp-vs#479, cp-vs#642). vCenters are searched
//! independently: one that is down does not stop look-ups in the others (but a search by
//! guest host name then fails, since a second VM with that name could be in the one that is
//! down).
//!
//! Credentials are read at every login (a rotated Secret or secrets-directory file is used
//! without a restart); rejected credentials are not sent again for minutes unless they changed
//! (vCenter SSO locks accounts), and concurrent callers share one re-login ([`vsphere_api::login`]).
//!
//! Deliberate differences: a VM that becomes invisible to the account *after a restart of
//! the CCM* (no reference remembered) cannot be told apart from a destroyed one, as upstream;
//! the `ethernets` of a guestinfo network config are taken in document order (upstream: Go
//! map order); the config file is watched by content every 2 s and a change stops the CCM
//! gracefully (exit 1) rather than with a fatal log.
//!
//! Not implemented: NSX-T load balancers and routes (out of scope: no emulator), the shared
//! session manager (its Secret keys are accepted and ignored) and certificate (solution user)
//! logins, and the legacy `Instances` interface (the controllers use `InstancesV2`).

pub mod config;
pub mod doctor;
pub mod guest_os;
pub mod guestinfo;
mod yaml;

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::Arc,
};

use async_trait::async_trait;
use ipnet::IpNet;
use k8s_cloud_provider::{
    CloudError, CloudProvider, CloudResult, InitContext, InstanceMetadata, InstancesV2,
    node::helpers::{node_name, provider_id},
    registry::Factory,
};
use k8s_openapi::api::core::v1::{Node, NodeAddress, Secret as KubeSecret};
use parking_lot::Mutex;
use tokio::sync::OnceCell;
use tracing::debug;
use vsphere_api::{
    CredentialSource, Credentials, Error as ApiError, MoRef, PropertySet, Secret,
    rest::RestClient,
    soap::{Client, GuestNicInfo},
    tls::TlsOptions,
};

use crate::config::{NodesConfig, VCenterConfig, VsphereConfig};

mod addresses;
mod lookup;
mod sessions;
mod zones;

pub use addresses::node_addresses;
use lookup::{Lookup, VmRef};
use sessions::{SessionCollector, datacenter_paths, logins, read_credentials};

/// The provider name.
pub const PROVIDER_NAME: &str = "vsphere";

/// VM properties read for a node.
const VM_PROPERTIES: [&str; 10] = [
    "config.extraConfig",
    "summary.config.uuid",
    "summary.config.numCpu",
    "summary.config.memorySizeMB",
    "summary.config.guestId",
    "summary.runtime.powerState",
    "guest.hostName",
    "guest.net",
    "runtime.host",
    "resourcePool",
];

/// The BIOS UUID of a provider ID `vsphere://<uuid>` (trimmed, lower-case).
pub fn uuid_from_provider_id(value: &str) -> Result<String, String> {
    let rest = value.strip_prefix("vsphere://").ok_or_else(|| {
        format!("spec.providerID {value:?} is not a vSphere provider ID (vsphere://<uuid>)")
    })?;
    let uuid = rest.trim().to_ascii_lowercase();
    if !is_uuid(&uuid) {
        return Err(format!("spec.providerID {value:?}: {uuid:?} is not a UUID"));
    }
    Ok(uuid)
}

/// Whether `s` is a UUID in its 8-4-4-4-12 hexadecimal form (ASCII only).
pub fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Swaps the byte order of the first three UUID groups (SMBIOS vs vCenter order, VS-02).
pub fn swap_uuid_byte_order(uuid: &str) -> Option<String> {
    if !is_uuid(uuid) {
        return None;
    }
    let parts: Vec<&str> = uuid.split('-').collect();
    let swap = |s: &str| -> String {
        let bytes: Vec<&str> = (0..s.len()).step_by(2).map(|i| &s[i..i + 2]).collect();
        bytes.into_iter().rev().collect()
    };
    Some(format!(
        "{}-{}-{}-{}-{}",
        swap(parts[0]),
        swap(parts[1]),
        swap(parts[2]),
        parts[3],
        parts[4]
    ))
}

/// `vsphere-vm.cpu-<n>.mem-<GB>gb.os-<short OS name>` (VS-12), with upstream's short names
/// ([`guest_os::short_name`]).
pub fn instance_type(num_cpu: i64, memory_mb: i64, guest_id: &str) -> String {
    format!(
        "vsphere-vm.cpu-{num_cpu}.mem-{}gb.os-{}",
        memory_mb / 1024,
        guest_os::short_name(guest_id)
    )
}

/// One vCenter: its settings, SOAP and REST clients (created on first use), datacenters.
struct VCenter {
    label: String,
    config: VCenterConfig,
    clients: OnceCell<(Arc<Client>, Arc<RestClient>)>,
    /// The datacenters to search, with when they were listed (listed again after
    /// [`DATACENTERS_REFRESH`]: datacenters are added and removed while the CCM runs).
    datacenters: tokio::sync::Mutex<Option<(std::time::Instant, Vec<MoRef>)>>,
    /// Set when a look-up missed [`VCENTER_LOOKUP_DEADLINE`]: until then the vCenter is not
    /// asked (its part of a look-up fails at once — an error, never "not found").
    unresponsive_until: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How long a vCenter's list of datacenters is used before it is listed again.
const DATACENTERS_REFRESH: std::time::Duration = std::time::Duration::from_secs(300);

/// The most one vCenter may take to answer one look-up of a node's VM (all its datacenters;
/// each SOAP call is a few milliseconds on a healthy vCenter). The vCenters are asked at once,
/// each within this deadline, so that a VM found by UUID in one vCenter is used at once and a
/// vCenter that hangs delays no look-up by more than this (without it, one SOAP call may take
/// 60 s × `soap-roundtrip-count` attempts).
pub const VCENTER_LOOKUP_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a vCenter that missed [`VCENTER_LOOKUP_DEADLINE`] is not asked again: the look-ups
/// of every node (one worker each in the node and lifecycle controllers) must not each wait out
/// the deadline of the same hung vCenter.
pub const VCENTER_UNRESPONSIVE_PAUSE: std::time::Duration = std::time::Duration::from_secs(30);

/// The vSphere cloud.
pub struct VsphereCloud {
    config: VsphereConfig,
    vcenters: Arc<Vec<VCenter>>,
    kube: Arc<Mutex<Option<kube::Client>>>,
    /// The VM last found for each Node name (VS-15), pruned to the informer's Nodes.
    seen: Mutex<HashMap<String, VmRef>>,
    nodes: Mutex<Option<k8s_controller_manager::informer::Store<Node>>>,
    tags: Mutex<HashMap<String, (TagInfo, std::time::Instant)>>,
    categories: Mutex<HashMap<String, (String, std::time::Instant)>>,
}

/// A tag's name and category ID.
type TagInfo = (String, String);

/// How long tag and category names are cached.
pub const TAG_CACHE_TTL: std::time::Duration = std::time::Duration::from_secs(600);

impl std::fmt::Debug for VsphereCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VsphereCloud")
            .field(
                "vcenters",
                &self.vcenters.iter().map(|v| &v.label).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

fn api_err(context: impl std::fmt::Display, e: ApiError) -> CloudError {
    CloudError::wrap(context, e)
}

impl VsphereCloud {
    /// A provider for `config` (connections are made on first use).
    pub fn new(config: VsphereConfig) -> Self {
        let vcenters = config
            .vcenters
            .iter()
            .map(|(label, vc)| VCenter {
                label: label.clone(),
                config: vc.clone(),
                clients: OnceCell::new(),
                datacenters: tokio::sync::Mutex::new(None),
                unresponsive_until: std::sync::Mutex::new(None),
            })
            .collect::<Vec<_>>();
        let vcenters = Arc::new(vcenters);
        Self {
            config,
            vcenters,
            kube: Arc::new(Mutex::new(None)),
            seen: Mutex::new(HashMap::new()),
            nodes: Mutex::new(None),
            tags: Mutex::new(HashMap::new()),
            categories: Mutex::new(HashMap::new()),
        }
    }

    /// The Kubernetes client used to read credentials from a Secret, for a program that uses
    /// the provider without the controller manager (which passes it in `Initialize`).
    pub fn set_kube_client(&self, client: kube::Client) {
        *self.kube.lock() = Some(client);
    }

    /// SOAP and REST logins so far, summed over vCenters: `(soap, rest)`.
    pub fn logins(&self) -> (u64, u64) {
        logins(&self.vcenters)
    }

    /// The credential source of one vCenter, asked at every login: the config file's
    /// user/password, then the secrets directory (`secretsDirectory`, else
    /// `/etc/cloud/secrets` when it exists, as upstream), then the Secret. Files and the
    /// Secret are read anew at each login, so rotated credentials are used without a restart;
    /// after vCenter rejected the config file's credentials, they are skipped (VS-23).
    fn credential_source(&self, vc: &VCenterConfig) -> CredentialSource {
        let vc = vc.clone();
        let configured_dir = self.config.secrets_directory.clone();
        let kube = self.kube.clone();
        CredentialSource::new(move |previous_rejected| {
            let vc = vc.clone();
            let configured_dir = configured_dir.clone();
            let kube = kube.lock().clone();
            Box::pin(async move {
                read_credentials(&vc, &configured_dir, kube, previous_rejected)
                    .await
                    .map_err(|e| vsphere_api::Error::Credentials(e.to_string()))
            })
        })
    }

    async fn clients(&self, i: usize) -> CloudResult<&(Arc<Client>, Arc<RestClient>)> {
        let vc = &self.vcenters[i];
        vc.clients
            .get_or_try_init(|| async {
                let ca_pem = if vc.config.ca_file.is_empty() {
                    None
                } else {
                    Some(
                        std::fs::read(&vc.config.ca_file)
                            .map_err(|e| CloudError::msg(format!("ca-file {}: {e}", vc.config.ca_file)))?,
                    )
                };
                let tls = TlsOptions {
                    insecure: vc.config.insecure,
                    ca_pem,
                    thumbprint: (!vc.config.thumbprint.is_empty()).then(|| vc.config.thumbprint.clone()),
                };
                let source = self.credential_source(&vc.config);
                let soap = Client::new(&vc.config.server, vc.config.port, &tls, source.clone())
                    .map_err(|e| api_err(format!("vCenter {}", vc.label), e))?
                    .with_retries(vc.config.soap_roundtrip_count.saturating_sub(1));
                let rest = RestClient::new(&vc.config.server, vc.config.port, &tls, source)
                    .map_err(|e| api_err(format!("vCenter {}", vc.label), e))?;
                Ok((Arc::new(soap), Arc::new(rest)))
            })
            .await
    }

    /// The datacenters to search in vCenter `i`. An account that sees no datacenter cannot
    /// prove that a VM is gone: that is an error, never an empty search.
    async fn datacenters(&self, i: usize) -> CloudResult<Vec<MoRef>> {
        let vc = &self.vcenters[i];
        let (soap, _) = self.clients(i).await?;
        let mut cached = vc.datacenters.lock().await;
        if let Some((at, list)) = cached.as_ref()
            && at.elapsed() < DATACENTERS_REFRESH
        {
            return Ok(list.clone());
        }
        let listed = async {
                let all = soap
                    .list_objects("Datacenter", &["name"])
                    .await
                    .map_err(|e| api_err(format!("listing datacenters of {}", vc.label), e))?;
                if all.is_empty() {
                    return Err(CloudError::msg(format!(
                        "vCenter {}: the account sees no datacenter, so no VM can be looked up (check its permissions)",
                        vc.label
                    )));
                }
                if vc.config.datacenters.is_empty() {
                    return Ok(all.into_iter().map(|(m, _)| m).collect());
                }
                let paths = datacenter_paths(soap, &all).await;
                let mut out = Vec::new();
                for wanted in &vc.config.datacenters {
                    let wanted_path = wanted.trim_matches('/');
                    let found = all.iter().find(|(m, p)| {
                        m.value == *wanted
                            || paths.get(&m.value).is_some_and(|path| path == wanted_path)
                            || (!wanted_path.contains('/') && p.string("name").as_deref() == Some(wanted_path))
                    });
                    match found {
                        Some((m, _)) => out.push(m.clone()),
                        None => {
                            return Err(CloudError::msg(format!(
                                "vCenter {}: datacenter {wanted:?} not found (names, inventory paths and managed object IDs are accepted)",
                                vc.label
                            )));
                        }
                    }
                }
                Ok(out)
        }
        .await?;
        *cached = Some((std::time::Instant::now(), listed.clone()));
        Ok(listed)
    }

    /// Logs out of every vCenter (SOAP and REST).
    pub async fn logout(&self) {
        for vc in self.vcenters.iter() {
            if let Some((soap, rest)) = vc.clients.get() {
                soap.logout().await;
                rest.logout().await;
            }
        }
    }
}

/// Upstream's default secrets directory, used when none is configured and it exists.
pub const DEFAULT_SECRETS_DIRECTORY: &str = "/etc/cloud/secrets";

/// The factory the cloud-controller-manager calls with the `--cloud-config` contents.
pub fn factory() -> Factory {
    Arc::new(|bytes: Option<Vec<u8>>| {
        Box::pin(async move {
            let config = config::VsphereConfig::parse(bytes.as_deref())?.apply_process_env()?;
            Ok(Arc::new(VsphereCloud::new(config)) as Arc<dyn CloudProvider>)
        })
    })
}

#[async_trait]
impl CloudProvider for VsphereCloud {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        *self.kube.lock() = Some(ctx.client);
        *self.nodes.lock() = Some(ctx.nodes);
        Ok(())
    }

    fn register_metrics(&self, metrics: &k8s_controller_manager::metrics::Metrics) {
        metrics.register(Box::new(SessionCollector::new(self.vcenters.clone())));
    }

    async fn shutdown(&self) {
        self.logout().await;
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
}

#[async_trait]
impl InstancesV2 for VsphereCloud {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        // Errors (vCenter down, credentials rejected, no visible datacenter, a malformed
        // systemUUID) propagate: the lifecycle controller keeps the Node.
        if let Lookup::Found(_) = self.find_vm(node).await? {
            return Ok(true);
        }
        if std::env::var_os("SKIP_NODE_DELETION").is_some() {
            return Err(CloudError::msg(format!(
                "node {}: VM not found, and SKIP_NODE_DELETION is set",
                node_name(node)
            )));
        }
        // Not found by UUID: if we have seen its VM, ask for that object directly (VS-15).
        let seen = self.seen.lock().get(node_name(node)).cloned();
        let Some(r) = seen else { return Ok(false) };
        let forget = || {
            self.seen.lock().remove(node_name(node));
        };
        let (soap, _) = self.clients(r.vcenter).await?;
        match soap
            .retrieve_properties(&r.vm, &["summary.runtime.powerState"])
            .await
        {
            Err(e) if e.is_fault("ManagedObjectNotFound") => {
                forget();
                Ok(false)
            }
            Err(e) => Err(api_err(format!("reading {}", r.vm), e)),
            Ok(p) => match p.string("summary.runtime.powerState").as_deref() {
                Some("poweredOn" | "poweredOff" | "suspended") => Ok(true),
                // An empty answer: the object exists but this account cannot read it.
                None => Err(CloudError::msg(format!(
                    "node {}: {} is no longer found by UUID, and vCenter returns no properties for it (not visible to this account?); keeping the node",
                    node_name(node),
                    r.vm
                ))),
                Some(other) => Err(CloudError::msg(format!(
                    "node {}: {} has power state {other:?}; keeping the node",
                    node_name(node),
                    r.vm
                ))),
            },
        }
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        let Some((_, props)) = self.found(node).await? else {
            return Ok(false);
        };
        Ok(props.string("summary.runtime.powerState").as_deref() != Some("poweredOn"))
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let (r, props) = self.found(node).await?.ok_or(CloudError::InstanceNotFound)?;
        let uuid = props
            .string("summary.config.uuid")
            .unwrap_or_default()
            .to_ascii_lowercase();
        if uuid.is_empty() {
            return Err(CloudError::msg(format!("{} has no summary.config.uuid", r.vm)));
        }
        let families = self.vcenters[r.vcenter].config.ip_family.clone();
        let static_first = guestinfo::static_addresses(&props.option_values("config.extraConfig"))
            .map_err(|e| CloudError::msg(format!("node {}: {} {e}", node_name(node), r.vm)))?;
        let addresses = node_addresses(
            &props.string("guest.hostName").unwrap_or_default(),
            &props.guest_nics("guest.net"),
            &self.config.nodes,
            &families,
            &static_first,
        )
        .map_err(|e| CloudError::msg(format!("node {}: {e}", node_name(node))))?;
        let (zone, region) = self.zone_region(&r, &props).await?;
        debug!(node = node_name(node), vm = %r.vm, uuid = %uuid, "found VM for node");
        Ok(Some(
            InstanceMetadata::new(format!("vsphere://{uuid}"))
                .with_instance_type(instance_type(
                    props.int("summary.config.numCpu").unwrap_or(0),
                    props.int("summary.config.memorySizeMB").unwrap_or(0),
                    &props.string("summary.config.guestId").unwrap_or_default(),
                ))
                .with_node_addresses(addresses)
                .with_zone(zone, region),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_and_byte_order() {
        assert_eq!(
            uuid_from_provider_id("vsphere://422E4956-AD22-1139-6D72-59CC8F2A4B1C ").unwrap(),
            "422e4956-ad22-1139-6d72-59cc8f2a4b1c"
        );
        assert!(
            uuid_from_provider_id("aws:///x/i-1")
                .unwrap_err()
                .contains("not a vSphere provider ID")
        );
        assert!(
            uuid_from_provider_id("vsphere://nope")
                .unwrap_err()
                .contains("is not a UUID")
        );
        assert_eq!(
            swap_uuid_byte_order("56492e42-22ad-3911-6d72-59cc8f2a4b1c").unwrap(),
            "422e4956-ad22-1139-6d72-59cc8f2a4b1c"
        );
        assert_eq!(swap_uuid_byte_order("bad"), None);
    }

    #[test]
    fn hostile_uuids_never_panic_and_never_search() {
        for hostile in [
            "ééééééé-éééé-éééé-éééé-éééééééééééé",
            "56492e42-22ad-3911-6d72-59cc8f2a4b1",
            "56492e4222ad39116d7259cc8f2a4b1c",
            "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz",
            "--------",
            "",
            "5é492e42-22ad-3911-6d72-59cc8f2a4b1c",
            "\u{0}",
        ] {
            assert!(!is_uuid(hostile), "{hostile:?}");
            assert_eq!(swap_uuid_byte_order(hostile), None, "{hostile:?}");
            assert!(uuid_from_provider_id(&format!("vsphere://{hostile}")).is_err());
            let mut node = Node::default();
            node.metadata.name = Some("n".into());
            node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
                node_info: Some(k8s_openapi::api::core::v1::NodeSystemInfo {
                    system_uuid: hostile.to_string(),
                    ..Default::default()
                }),
                ..Default::default()
            });
            let got = VsphereCloud::node_uuids(&node);
            if hostile.is_empty() {
                assert!(got.unwrap().is_empty(), "no systemUUID: search by name");
            } else {
                assert!(
                    got.unwrap_err().to_string().contains("is not a UUID"),
                    "{hostile:?}: a malformed systemUUID is an error, not a search"
                );
            }
        }
        assert!(is_uuid("56492e42-22ad-3911-6d72-59cc8f2a4b1c"));
    }

    #[test]
    fn instance_type_string() {
        assert_eq!(
            instance_type(4, 16384, "ubuntu64Guest"),
            "vsphere-vm.cpu-4.mem-16gb.os-ubuntu"
        );
        assert_eq!(instance_type(1, 32, ""), "vsphere-vm.cpu-1.mem-0gb.os-unknown");
    }

    fn nic(network: &str, ips: &[&str], device: i32) -> GuestNicInfo {
        GuestNicInfo {
            network: network.into(),
            ip_addresses: ips.iter().map(|s| s.to_string()).collect(),
            mac_address: String::new(),
            device_config_id: device,
        }
    }

    fn a(t: &str, v: &str) -> NodeAddress {
        NodeAddress {
            type_: t.into(),
            address: v.into(),
        }
    }

    #[test]
    fn addresses_default_to_the_first_usable_ip_for_both_types() {
        let nics = vec![
            nic("", &["169.254.1.1", "fe80::1"], 4000),
            nic("", &["172.17.0.1"], -1),
            nic("VM Network", &["10.0.0.5", "10.0.0.6"], 4001),
        ];
        let got = node_addresses("node-1", &nics, &NodesConfig::default(), &["ipv4".into()], &[]).unwrap();
        assert_eq!(
            got,
            vec![
                a("Hostname", "node-1"),
                a("InternalIP", "10.0.0.5"),
                a("ExternalIP", "10.0.0.5")
            ]
        );
    }

    #[test]
    fn statically_configured_addresses_come_first_and_exclusions_still_hold() {
        let nics = vec![
            nic("a", &["10.0.0.5", "10.0.0.6"], 4000),
            nic("b", &["192.168.1.9", "fd00::7"], 4001),
        ];
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let got = node_addresses(
            "n",
            &nics,
            &NodesConfig::default(),
            &["ipv4".into()],
            &[ip("192.168.1.9"), ip("10.0.0.6")],
        )
        .unwrap();
        assert_eq!(got[1], a("InternalIP", "192.168.1.9"));
        // Exclusions hold on the fallback path, each for its own type.
        let only_internal_excluded = NodesConfig {
            exclude_internal_network_subnet_cidr: vec!["10.0.0.0/8".parse().unwrap()],
            ..Default::default()
        };
        let got = node_addresses("n", &nics, &only_internal_excluded, &["ipv4".into()], &[]).unwrap();
        assert_eq!(
            got[1..],
            [a("InternalIP", "192.168.1.9"), a("ExternalIP", "10.0.0.5")]
        );
        // An excluded static address is still excluded (exclusions have the highest precedence).
        let excl = NodesConfig {
            exclude_internal_network_subnet_cidr: vec!["192.168.0.0/16".parse().unwrap()],
            exclude_external_network_subnet_cidr: vec!["192.168.0.0/16".parse().unwrap()],
            ..Default::default()
        };
        let got = node_addresses(
            "n",
            &nics,
            &excl,
            &["ipv4".into()],
            &[ip("192.168.1.9"), ip("10.0.0.6")],
        )
        .unwrap();
        assert_eq!(got[1], a("InternalIP", "10.0.0.6"));
        assert_eq!(got[2], a("ExternalIP", "10.0.0.6"));
    }

    #[test]
    fn cidrs_network_names_and_exclusions() {
        let nics = vec![
            nic("mgmt", &["192.168.1.10"], 4000),
            nic("data", &["10.0.0.5", "fd00::5"], 4001),
        ];
        let cfg = NodesConfig {
            internal_network_subnet_cidr: vec!["10.0.0.0/8".parse().unwrap()],
            external_vm_network_name: "MGMT".into(),
            ..Default::default()
        };
        let got = node_addresses("n", &nics, &cfg, &["ipv4".into(), "ipv6".into()], &[]).unwrap();
        assert_eq!(
            got,
            vec![
                a("Hostname", "n"),
                a("InternalIP", "10.0.0.5"),
                a("ExternalIP", "192.168.1.10"),
                a("InternalIP", "fd00::5"),
                a("ExternalIP", "fd00::5")
            ]
        );
        let excl = NodesConfig {
            exclude_internal_network_subnet_cidr: vec!["192.168.0.0/16".parse().unwrap()],
            ..Default::default()
        };
        let got = node_addresses("n", &nics, &excl, &["ipv4".into()], &[]).unwrap();
        assert_eq!(got[1], a("InternalIP", "10.0.0.5"));
        assert!(node_addresses("n", &nics, &NodesConfig::default(), &["ipv6".into()], &[]).is_ok());
        assert!(
            node_addresses(
                "n",
                &[nic("", &["10.0.0.1"], 4000)],
                &NodesConfig::default(),
                &["ipv6".into()],
                &[]
            )
            .unwrap_err()
            .contains("unable to find suitable IP address")
        );
        let both = NodesConfig {
            internal_vm_network_name: "x".into(),
            external_vm_network_name: "y".into(),
            ..Default::default()
        };
        assert!(
            node_addresses("n", &nics, &both, &["ipv4".into()], &[])
                .unwrap_err()
                .contains("neither network")
        );
    }
}
