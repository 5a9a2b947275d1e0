//! The cloud config of cloud-provider-openstack's `openstack-cloud-controller-manager`: an INI
//! file (`gcfg`) with `[Global]`, `[LoadBalancer]`, `[Networking]`, `[Metadata]` and `[Route]`,
//! where `[Global]` may instead point at a `clouds.yaml` (`use-clouds`, `clouds-file`, `cloud`).
//!
//! As upstream (gcfg `FatalOnly`), unknown sections and keys are warnings, never errors; a bad
//! value is an error naming the section, the key and the value (a password never).

use std::{path::PathBuf, time::Duration};

use k8s_cloud_provider::gcfg;
use k8s_controller_manager::duration::parse_go_duration;

/// A configuration error: what is wrong and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cloud config: {0}")]
pub struct ConfigError(pub String);

/// Keystone v3 credentials.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AuthOptions {
    /// `auth-url`: the keystone endpoint (`…/v3`).
    pub auth_url: String,
    /// `username`.
    pub username: String,
    /// `user-id`.
    pub user_id: String,
    /// `password` (never printed).
    pub password: String,
    /// `tenant-id` / `project-id`.
    pub project_id: String,
    /// `tenant-name` / `project-name`.
    pub project_name: String,
    /// `domain-id`: default for the user's and the project's domain.
    pub domain_id: String,
    /// `domain-name`: default for the user's and the project's domain.
    pub domain_name: String,
    /// `user-domain-id`.
    pub user_domain_id: String,
    /// `user-domain-name`.
    pub user_domain_name: String,
    /// `tenant-domain-id` / `project-domain-id`.
    pub project_domain_id: String,
    /// `tenant-domain-name` / `project-domain-name`.
    pub project_domain_name: String,
    /// `application-credential-id`.
    pub application_credential_id: String,
    /// `application-credential-name`.
    pub application_credential_name: String,
    /// `application-credential-secret` (never printed).
    pub application_credential_secret: String,
    /// `trust-id`.
    pub trust_id: String,
    /// `trustee-id`: with `trust-id`, the user that authenticates (OCCM's legacy trusts).
    pub trustee_id: String,
    /// `trustee-password` (never printed).
    pub trustee_password: String,
}

impl std::fmt::Debug for AuthOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthOptions")
            .field("auth_url", &self.auth_url)
            .field("username", &self.username)
            .field("user_id", &self.user_id)
            .field("project_id", &self.project_id)
            .field("project_name", &self.project_name)
            .field("application_credential_id", &self.application_credential_id)
            .finish_non_exhaustive()
    }
}

/// `[Global]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Global {
    /// The credentials (from the INI file, or from `clouds.yaml` with `use-clouds`).
    pub auth: AuthOptions,
    /// `region`: the catalog region (and the Nodes' region label).
    pub region: String,
    /// `ca-file`: PEM bundle to trust instead of the system roots.
    pub ca_file: Option<PathBuf>,
    /// `tls-insecure`: skip TLS verification.
    pub tls_insecure: bool,
    /// `cert-file`: the client certificate (PEM) for TLS client authentication.
    pub cert_file: Option<PathBuf>,
    /// `key-file`: its private key (PEM).
    pub key_file: Option<PathBuf>,
    /// `interface` (gophercloud's availability): `public` (default), `internal` or `admin`.
    pub interface: String,
}

/// The load balancer's health monitor settings (`[LoadBalancer] monitor-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorOptions {
    /// `create-monitor`.
    pub create: bool,
    /// `monitor-delay` (5s).
    pub delay: Duration,
    /// `monitor-timeout` (3s).
    pub timeout: Duration,
    /// `monitor-max-retries` (1).
    pub max_retries: u32,
    /// `monitor-max-retries-down` (3).
    pub max_retries_down: u32,
}

/// `[LoadBalancer]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadBalancerOptions {
    /// `enabled` (true).
    pub enabled: bool,
    /// `subnet-id`: the VIP's and the members' subnet.
    pub subnet_id: String,
    /// `network-id`: the VIP's network.
    pub network_id: String,
    /// `floating-network-id`: where floating IPs for external Services come from.
    pub floating_network_id: String,
    /// `floating-subnet-id`.
    pub floating_subnet_id: String,
    /// `floating-subnet`: a name pattern of floating subnets (without `floating-subnet-id`).
    pub floating_subnet: String,
    /// `floating-subnet-tags`: a tag expression of floating subnets.
    pub floating_subnet_tags: String,
    /// `member-subnet-id`: the members' subnet (default: the VIP subnet).
    pub member_subnet_id: String,
    /// `lb-method` (ROUND_ROBIN).
    pub lb_method: String,
    /// `lb-provider`.
    pub lb_provider: String,
    /// `internal-lb` (false): no floating IP by default.
    pub internal_lb: bool,
    /// `cascade-delete` (true).
    pub cascade_delete: bool,
    /// `flavor-id`.
    pub flavor_id: String,
    /// `availability-zone`.
    pub availability_zone: String,
    /// Health monitors.
    pub monitor: MonitorOptions,
    /// `enable-ingress-hostname` (false): with PROXY protocol the status shows the hostname
    /// `<address>.<ingress-hostname-suffix>` instead of the address (so that kube-proxy does
    /// not short-circuit the load balancer and its PROXY header).
    pub enable_ingress_hostname: bool,
    /// `ingress-hostname-suffix` (`nip.io`).
    pub ingress_hostname_suffix: String,
    /// `max-shared-lb` (2): how many Services may share one load balancer (through the
    /// `loadbalancer.openstack.org/load-balancer-id` annotation).
    pub max_shared_lb: u32,
    /// `node-selector`: `key=value,key2` labels a Node needs to be a member (empty: every
    /// Node); the `loadbalancer.openstack.org/node-selector` annotation overrides it.
    pub node_selector: String,
    /// `[LoadBalancerClass "<name>"]` sections, chosen by the
    /// `loadbalancer.openstack.org/class` annotation.
    pub classes: std::collections::BTreeMap<String, LoadBalancerClass>,
    /// `default-tls-container-ref`: the barbican secret or container of the certificate every
    /// Service's TCP ports terminate TLS with (`TERMINATED_HTTPS` listeners, HTTP pools); the
    /// `loadbalancer.openstack.org/default-tls-container-ref` annotation overrides it.
    pub tls_container_ref: String,
    /// `manage-security-groups` (false): each Service gets a security group opening its
    /// NodePorts to the members' subnet, added to the member Nodes' ports (OCCM).
    pub manage_security_groups: bool,
    /// `container-store` (`barbican`): where TLS references live; with `barbican` each is read
    /// before it is used, with `external` it is passed to Octavia as written.
    pub container_store: ContainerStore,
}

/// `[LoadBalancer] container-store`: where TLS certificate references point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerStore {
    /// barbican (OCCM's default): a reference is checked in barbican (it exists and the
    /// provider's user may read it) before a listener uses it.
    Barbican,
    /// Another store Octavia knows: references are passed on unchecked.
    External,
}

/// `[LoadBalancerClass "<name>"]`: networks and subnets a Service picks by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadBalancerClass {
    /// `floating-network-id`.
    pub floating_network_id: String,
    /// `floating-subnet-id`.
    pub floating_subnet_id: String,
    /// `floating-subnet`.
    pub floating_subnet: String,
    /// `floating-subnet-tags`.
    pub floating_subnet_tags: String,
    /// `network-id`: the VIP's network.
    pub network_id: String,
    /// `subnet-id`: the VIP's subnet.
    pub subnet_id: String,
    /// `member-subnet-id`.
    pub member_subnet_id: String,
}

impl Default for LoadBalancerOptions {
    fn default() -> Self {
        Self {
            enabled: true,
            subnet_id: String::new(),
            network_id: String::new(),
            floating_network_id: String::new(),
            floating_subnet_id: String::new(),
            floating_subnet: String::new(),
            floating_subnet_tags: String::new(),
            member_subnet_id: String::new(),
            lb_method: "ROUND_ROBIN".into(),
            lb_provider: String::new(),
            internal_lb: false,
            cascade_delete: true,
            flavor_id: String::new(),
            availability_zone: String::new(),
            monitor: MonitorOptions {
                create: false,
                delay: Duration::from_secs(5),
                timeout: Duration::from_secs(3),
                max_retries: 1,
                max_retries_down: 3,
            },
            enable_ingress_hostname: false,
            ingress_hostname_suffix: "nip.io".into(),
            max_shared_lb: 2,
            node_selector: String::new(),
            classes: Default::default(),
            tls_container_ref: String::new(),
            container_store: ContainerStore::Barbican,
            manage_security_groups: false,
        }
    }
}

/// `[Networking]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkingOptions {
    /// `ipv6-support-disabled`: leave IPv6 addresses out of the Nodes'.
    pub ipv6_support_disabled: bool,
    /// `public-network-name` (repeatable): their addresses are ExternalIP.
    pub public_network_names: Vec<String>,
    /// `internal-network-name` (repeatable): their addresses are InternalIP.
    pub internal_network_names: Vec<String>,
    /// `address-sort-order`: comma-separated CIDRs; matching addresses come first.
    pub address_sort_order: Vec<ipnet::IpNet>,
}

/// `[Metadata]`: `request-timeout` bounds every API request, as in OCCM (60 s when unset or
/// zero); `search-order` is read and checked, unused (the controller manager asks the APIs,
/// not the metadata service).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataOptions {
    /// `search-order` (`configDrive,metadataService`).
    pub search_order: String,
    /// `request-timeout`.
    pub request_timeout: Option<Duration>,
}

impl Default for MetadataOptions {
    fn default() -> Self {
        Self {
            search_order: "configDrive,metadataService".into(),
            request_timeout: None,
        }
    }
}

/// `[Route]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteOptions {
    /// `router-id`: the neutron router that carries the Pod routes; routes are off without it.
    pub router_id: String,
}

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenStackConfig {
    /// `[Global]`.
    pub global: Global,
    /// `[LoadBalancer]`.
    pub load_balancer: LoadBalancerOptions,
    /// `[Networking]`.
    pub networking: NetworkingOptions,
    /// `[Metadata]`.
    pub metadata: MetadataOptions,
    /// `[Route]`.
    pub route: RouteOptions,
    /// Unknown sections and keys (upstream warns and goes on).
    pub warnings: Vec<String>,
}

/// Why an OCCM `[LoadBalancer]` key is not acted on (the README's table says the same).
fn unsupported_why(key: &str) -> &'static str {
    match key {
        "provider-requires-serial-api-calls" => "members are always set in one batch call",
        _ => "not implemented",
    }
}

/// A `floating-subnet` name pattern, checked.
fn subnet_pattern(section: &gcfg::Section, e: &gcfg::Entry) -> Result<String, ConfigError> {
    let v = text(section, e)?;
    crate::loadbalancer::FloatingSubnetSpec {
        pattern: v.clone(),
        ..Default::default()
    }
    .matcher()
    .map_err(|m| ConfigError(format!("{}: {m}", place(section, e))))?;
    Ok(v)
}

fn place(section: &gcfg::Section, e: &gcfg::Entry) -> String {
    format!("{} {} (line {})", section.display_name(), e.key, e.line)
}

fn text(section: &gcfg::Section, e: &gcfg::Entry) -> Result<String, ConfigError> {
    e.value
        .clone()
        .ok_or_else(|| ConfigError(format!("{}: needs a value", place(section, e))))
}

fn boolean(section: &gcfg::Section, e: &gcfg::Entry) -> Result<bool, ConfigError> {
    gcfg::parse_bool(e.value.as_deref()).ok_or_else(|| {
        ConfigError(format!(
            "{}: {:?} is not a boolean (true/false)",
            place(section, e),
            e.value.as_deref().unwrap_or_default()
        ))
    })
}

fn duration(section: &gcfg::Section, e: &gcfg::Entry) -> Result<Duration, ConfigError> {
    let v = text(section, e)?;
    parse_go_duration(&v).map_err(|_| {
        ConfigError(format!(
            "{}: {v:?} is not a duration (like 5s or 1m30s)",
            place(section, e)
        ))
    })
}

fn count(section: &gcfg::Section, e: &gcfg::Entry) -> Result<u32, ConfigError> {
    let v = text(section, e)?;
    gcfg::parse_int(&v)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            ConfigError(format!(
                "{}: {v:?} is not a non-negative integer",
                place(section, e)
            ))
        })
}

impl OpenStackConfig {
    /// Parses the INI file (`None` or empty: every default, which fails [`Self::validate`]).
    pub fn parse(bytes: Option<&[u8]>) -> Result<Self, ConfigError> {
        let mut config = OpenStackConfig::default();
        let Some(bytes) = bytes else { return Ok(config) };
        let text_all = std::str::from_utf8(bytes).map_err(|e| ConfigError(format!("not UTF-8: {e}")))?;
        let sections = gcfg::parse(text_all).map_err(|e| ConfigError(e.to_string()))?;
        let mut use_clouds = false;
        let mut clouds_file = None;
        let mut cloud = String::new();
        for s in &sections {
            let name = s.name.to_ascii_lowercase();
            for e in &s.entries {
                let key = e.key.to_ascii_lowercase();
                let g = &mut config.global;
                let a = &mut g.auth;
                let lb = &mut config.load_balancer;
                let net = &mut config.networking;
                match (name.as_str(), key.as_str()) {
                    ("global", "auth-url") => a.auth_url = text(s, e)?,
                    ("global", "username" | "user-name") => a.username = text(s, e)?,
                    ("global", "user-id") => a.user_id = text(s, e)?,
                    ("global", "password") => a.password = text(s, e)?,
                    ("global", "tenant-id" | "project-id") => a.project_id = text(s, e)?,
                    ("global", "tenant-name" | "project-name") => a.project_name = text(s, e)?,
                    ("global", "domain-id") => a.domain_id = text(s, e)?,
                    ("global", "domain-name") => a.domain_name = text(s, e)?,
                    ("global", "user-domain-id") => a.user_domain_id = text(s, e)?,
                    ("global", "user-domain-name") => a.user_domain_name = text(s, e)?,
                    ("global", "tenant-domain-id" | "project-domain-id") => a.project_domain_id = text(s, e)?,
                    ("global", "tenant-domain-name" | "project-domain-name") => {
                        a.project_domain_name = text(s, e)?
                    }
                    ("global", "application-credential-id") => a.application_credential_id = text(s, e)?,
                    ("global", "application-credential-name") => a.application_credential_name = text(s, e)?,
                    ("global", "application-credential-secret") => {
                        a.application_credential_secret = text(s, e)?
                    }
                    ("global", "trust-id") => a.trust_id = text(s, e)?,
                    ("global", "trustee-id") => a.trustee_id = text(s, e)?,
                    ("global", "trustee-password") => a.trustee_password = text(s, e)?,
                    ("global", "cert-file") => g.cert_file = Some(PathBuf::from(text(s, e)?)),
                    ("global", "key-file") => g.key_file = Some(PathBuf::from(text(s, e)?)),
                    ("global", "region") => g.region = text(s, e)?,
                    ("global", "ca-file") => g.ca_file = Some(PathBuf::from(text(s, e)?)),
                    ("global", "tls-insecure") => g.tls_insecure = boolean(s, e)?,
                    ("global", "os-endpoint-type" | "interface" | "endpoint-type") => {
                        let v = text(s, e)?;
                        let v = v.trim_end_matches("URL").to_ascii_lowercase();
                        if !matches!(v.as_str(), "public" | "internal" | "admin") {
                            return Err(ConfigError(format!(
                                "{}: {v:?} is not public, internal or admin",
                                place(s, e)
                            )));
                        }
                        g.interface = v;
                    }
                    ("global", "use-clouds") => use_clouds = boolean(s, e)?,
                    ("global", "clouds-file") => clouds_file = Some(PathBuf::from(text(s, e)?)),
                    ("global", "cloud") => cloud = text(s, e)?,
                    ("loadbalancer", "enabled") => lb.enabled = boolean(s, e)?,
                    ("loadbalancer", "subnet-id") => lb.subnet_id = text(s, e)?,
                    ("loadbalancer", "network-id") => lb.network_id = text(s, e)?,
                    ("loadbalancer", "floating-network-id") => lb.floating_network_id = text(s, e)?,
                    ("loadbalancer", "floating-subnet-id") => lb.floating_subnet_id = text(s, e)?,
                    ("loadbalancer", "floating-subnet") => lb.floating_subnet = subnet_pattern(s, e)?,
                    ("loadbalancer", "floating-subnet-tags") => lb.floating_subnet_tags = text(s, e)?,
                    ("loadbalancer", "member-subnet-id") => lb.member_subnet_id = text(s, e)?,
                    ("loadbalancer", "lb-method") => lb.lb_method = lb_method(s, e)?,
                    ("loadbalancer", "lb-provider") => lb.lb_provider = text(s, e)?,
                    ("loadbalancer", "internal-lb") => lb.internal_lb = boolean(s, e)?,
                    ("loadbalancer", "cascade-delete") => lb.cascade_delete = boolean(s, e)?,
                    ("loadbalancer", "flavor-id") => lb.flavor_id = text(s, e)?,
                    ("loadbalancer", "availability-zone") => lb.availability_zone = text(s, e)?,
                    ("loadbalancer", "create-monitor") => lb.monitor.create = boolean(s, e)?,
                    ("loadbalancer", "monitor-delay") => lb.monitor.delay = duration(s, e)?,
                    ("loadbalancer", "monitor-timeout") => lb.monitor.timeout = duration(s, e)?,
                    ("loadbalancer", "monitor-max-retries") => lb.monitor.max_retries = count(s, e)?,
                    ("loadbalancer", "monitor-max-retries-down") => {
                        lb.monitor.max_retries_down = count(s, e)?
                    }
                    ("loadbalancer", "max-shared-lb") => {
                        lb.max_shared_lb = count(s, e)?;
                        if lb.max_shared_lb == 0 {
                            return Err(ConfigError(format!(
                                "{}: 0 is not a number of Services (at least 1)",
                                place(s, e)
                            )));
                        }
                    }
                    ("loadbalancer", "node-selector") => lb.node_selector = text(s, e)?,
                    ("loadbalancer", "enable-ingress-hostname") => {
                        lb.enable_ingress_hostname = boolean(s, e)?
                    }
                    ("loadbalancer", "ingress-hostname-suffix") => lb.ingress_hostname_suffix = text(s, e)?,
                    // Keys OCCM documents that this provider does not act on: warned, never
                    // fatal, so that an OCCM cloud.conf is read unchanged.
                    ("loadbalancer", "manage-security-groups") => lb.manage_security_groups = boolean(s, e)?,
                    ("loadbalancer", "lb-version") => {
                        let v = text(s, e)?;
                        if !v.is_empty() && v != "v2" {
                            return Err(ConfigError(format!(
                                "{}: {v:?} is not v2 (the only Octavia API)",
                                place(s, e)
                            )));
                        }
                    }
                    ("loadbalancer", "default-tls-container-ref") => lb.tls_container_ref = text(s, e)?,
                    ("loadbalancer", "container-store") => {
                        lb.container_store = match text(s, e)?.as_str() {
                            "barbican" | "" => ContainerStore::Barbican,
                            "external" => ContainerStore::External,
                            other => {
                                return Err(ConfigError(format!(
                                    "{}: {other:?} is not a container store (barbican or external)",
                                    place(s, e)
                                )));
                            }
                        }
                    }
                    ("loadbalancer", key @ "provider-requires-serial-api-calls") => {
                        config.warnings.push(format!(
                            "{}: not supported by this provider, ignored ({})",
                            place(s, e),
                            unsupported_why(key)
                        ))
                    }
                    ("networking", "ipv6-support-disabled") => net.ipv6_support_disabled = boolean(s, e)?,
                    ("networking", "public-network-name") => net.public_network_names.push(text(s, e)?),
                    ("networking", "internal-network-name") => net.internal_network_names.push(text(s, e)?),
                    ("networking", "address-sort-order") => {
                        let v = text(s, e)?;
                        for cidr in v.split(',').map(str::trim).filter(|c| !c.is_empty()) {
                            let parsed = cidr.parse().map_err(|_| {
                                ConfigError(format!("{}: {cidr:?} is not a CIDR", place(s, e)))
                            })?;
                            net.address_sort_order.push(parsed);
                        }
                    }
                    ("metadata", "search-order") => {
                        let v = text(s, e)?;
                        for item in v.split(',').map(str::trim) {
                            if item != "configDrive" && item != "metadataService" {
                                return Err(ConfigError(format!(
                                    "{}: {item:?} is neither configDrive nor metadataService",
                                    place(s, e)
                                )));
                            }
                        }
                        config.metadata.search_order = v;
                    }
                    ("metadata", "request-timeout") => {
                        config.metadata.request_timeout = Some(duration(s, e)?)
                    }
                    ("route", "router-id") => config.route.router_id = text(s, e)?,
                    ("loadbalancerclass", _) => {
                        let Some(class) = s.subsection.clone() else {
                            return Err(ConfigError(format!(
                                "{}: a [LoadBalancerClass] section needs a name: [LoadBalancerClass \"<name>\"]",
                                place(s, e)
                            )));
                        };
                        let c = lb.classes.entry(class).or_default();
                        match key.as_str() {
                            "floating-network-id" => c.floating_network_id = text(s, e)?,
                            "floating-subnet-id" => c.floating_subnet_id = text(s, e)?,
                            "network-id" => c.network_id = text(s, e)?,
                            "subnet-id" => c.subnet_id = text(s, e)?,
                            "member-subnet-id" => c.member_subnet_id = text(s, e)?,
                            "floating-subnet" => c.floating_subnet = subnet_pattern(s, e)?,
                            "floating-subnet-tags" => c.floating_subnet_tags = text(s, e)?,
                            _ => config
                                .warnings
                                .push(format!("{}: unknown key, ignored", place(s, e))),
                        }
                    }
                    ("global" | "loadbalancer" | "networking" | "metadata" | "route", _) => config
                        .warnings
                        .push(format!("{}: unknown key, ignored", place(s, e))),
                    _ => {}
                }
            }
            if !matches!(
                name.as_str(),
                "global" | "loadbalancer" | "networking" | "metadata" | "route" | "loadbalancerclass"
            ) {
                config.warnings.push(format!(
                    "{} (line {}): unknown section, ignored",
                    s.display_name(),
                    s.line
                ));
            }
        }
        if config.global.interface.is_empty() {
            config.global.interface = "public".into();
        }
        if use_clouds {
            config.apply_clouds_yaml(clouds_file, &cloud)?;
        }
        Ok(config)
    }

    /// `use-clouds = true`: the credentials and region come from `clouds.yaml` (the file named
    /// by `clouds-file`, else `$OS_CLIENT_CONFIG_FILE`, `./clouds.yaml`,
    /// `~/.config/openstack/clouds.yaml`, `/etc/openstack/clouds.yaml`), entry `cloud`
    /// (`$OS_CLOUD`, else `openstack`). Values set in `[Global]` win, as upstream.
    fn apply_clouds_yaml(&mut self, file: Option<PathBuf>, cloud: &str) -> Result<(), ConfigError> {
        let candidates: Vec<PathBuf> = match file {
            Some(f) => vec![f],
            None => {
                let mut c = Vec::new();
                if let Ok(f) = std::env::var("OS_CLIENT_CONFIG_FILE") {
                    c.push(PathBuf::from(f));
                }
                c.push(PathBuf::from("clouds.yaml"));
                if let Ok(home) = std::env::var("HOME") {
                    c.push(PathBuf::from(home).join(".config/openstack/clouds.yaml"));
                }
                c.push(PathBuf::from("/etc/openstack/clouds.yaml"));
                c
            }
        };
        let path = candidates.iter().find(|p| p.is_file()).ok_or_else(|| {
            ConfigError(format!(
                "[Global] use-clouds: no clouds.yaml found (looked at {})",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        let body = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("[Global] clouds-file {}: {e}", path.display())))?;
        let name = if cloud.is_empty() {
            std::env::var("OS_CLOUD").unwrap_or_else(|_| "openstack".into())
        } else {
            cloud.to_string()
        };
        self.apply_clouds_yaml_text(&body, &name, &path.display().to_string())
    }

    /// Applies the entry `name` of a clouds.yaml document read from `origin` (named in errors):
    /// the values `[Global]` left empty.
    pub fn apply_clouds_yaml_text(
        &mut self,
        body: &str,
        name: &str,
        origin: &str,
    ) -> Result<(), ConfigError> {
        let doc: CloudsYaml = serde_saphyr::from_str(body)
            .map_err(|e| ConfigError(format!("[Global] clouds-file {origin}: {e}")))?;
        let entry = doc.clouds.get(name).ok_or_else(|| {
            ConfigError(format!(
                "[Global] cloud {name:?}: no such entry in {origin} (it has: {})",
                doc.clouds.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        let a = &mut self.global.auth;
        let y = &entry.auth;
        let fill = |dst: &mut String, src: &Option<String>| {
            if dst.is_empty()
                && let Some(v) = src
            {
                dst.clone_from(v);
            }
        };
        fill(&mut a.auth_url, &y.auth_url);
        fill(&mut a.username, &y.username);
        fill(&mut a.user_id, &y.user_id);
        fill(&mut a.password, &y.password);
        fill(
            &mut a.project_id,
            &y.project_id.clone().or_else(|| y.tenant_id.clone()),
        );
        fill(
            &mut a.project_name,
            &y.project_name.clone().or_else(|| y.tenant_name.clone()),
        );
        fill(&mut a.domain_id, &y.domain_id);
        fill(&mut a.domain_name, &y.domain_name);
        fill(&mut a.user_domain_id, &y.user_domain_id);
        fill(&mut a.user_domain_name, &y.user_domain_name);
        fill(&mut a.project_domain_id, &y.project_domain_id);
        fill(&mut a.project_domain_name, &y.project_domain_name);
        fill(&mut a.application_credential_id, &y.application_credential_id);
        fill(&mut a.application_credential_name, &y.application_credential_name);
        fill(
            &mut a.application_credential_secret,
            &y.application_credential_secret,
        );
        fill(&mut self.global.region, &entry.region_name);
        if self.global.ca_file.is_none() {
            self.global.ca_file = entry.cacert.clone().map(PathBuf::from);
        }
        if entry.verify == Some(false) {
            self.global.tls_insecure = true;
        }
        Ok(())
    }

    /// Checks that the credentials are complete enough to ask keystone for a token.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let lb = &self.load_balancer;
        if lb.container_store == ContainerStore::Barbican && !lb.tls_container_ref.is_empty() {
            crate::loadbalancer::tls::barbican_reference(&lb.tls_container_ref)
                .map_err(|m| ConfigError(format!("[LoadBalancer] default-tls-container-ref: {m}")))?;
        }
        let a = &self.global.auth;
        if a.auth_url.is_empty() {
            return Err(ConfigError("[Global] auth-url is required".into()));
        }
        let url = url::Url::parse(&a.auth_url)
            .map_err(|e| ConfigError(format!("[Global] auth-url {:?}: {e}", a.auth_url)))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ConfigError(format!(
                "[Global] auth-url {:?}: not an http(s) URL",
                a.auth_url
            )));
        }
        if !a.application_credential_id.is_empty() || !a.application_credential_name.is_empty() {
            if a.application_credential_secret.is_empty() {
                return Err(ConfigError(
                    "[Global] application-credential-secret is required with an application credential"
                        .into(),
                ));
            }
            return Ok(());
        }
        if self.global.cert_file.is_some() != self.global.key_file.is_some() {
            return Err(ConfigError(
                "[Global] cert-file and key-file go together: set both or neither".into(),
            ));
        }
        if !a.trustee_id.is_empty() || !a.trustee_password.is_empty() {
            if a.trust_id.is_empty() {
                return Err(ConfigError(
                    "[Global] trustee-id and trustee-password need trust-id".into(),
                ));
            }
            if a.trustee_id.is_empty() || a.trustee_password.is_empty() {
                return Err(ConfigError(
                    "[Global] trustee-id and trustee-password go together: set both".into(),
                ));
            }
            return Ok(());
        }
        if a.username.is_empty() && a.user_id.is_empty() {
            return Err(ConfigError("[Global] username or user-id is required".into()));
        }
        if a.password.is_empty() {
            return Err(ConfigError("[Global] password is required".into()));
        }
        Ok(())
    }
}

fn lb_method(s: &gcfg::Section, e: &gcfg::Entry) -> Result<String, ConfigError> {
    let v = text(s, e)?;
    check_lb_method(&v).map_err(|m| ConfigError(format!("{}: {m}", place(s, e))))
}

/// Octavia's algorithms: `ROUND_ROBIN`, `LEAST_CONNECTIONS`, `SOURCE_IP`, `SOURCE_IP_PORT`.
pub fn check_lb_method(v: &str) -> Result<String, String> {
    match v {
        "ROUND_ROBIN" | "LEAST_CONNECTIONS" | "SOURCE_IP" | "SOURCE_IP_PORT" => Ok(v.to_string()),
        _ => Err(format!(
            "{v:?} is not ROUND_ROBIN, LEAST_CONNECTIONS, SOURCE_IP or SOURCE_IP_PORT"
        )),
    }
}

#[derive(Debug, serde::Deserialize)]
struct CloudsYaml {
    #[serde(default)]
    clouds: std::collections::BTreeMap<String, CloudEntry>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct CloudEntry {
    #[serde(default)]
    auth: CloudAuth,
    region_name: Option<String>,
    cacert: Option<String>,
    verify: Option<bool>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct CloudAuth {
    auth_url: Option<String>,
    username: Option<String>,
    user_id: Option<String>,
    password: Option<String>,
    project_id: Option<String>,
    project_name: Option<String>,
    tenant_id: Option<String>,
    tenant_name: Option<String>,
    domain_id: Option<String>,
    domain_name: Option<String>,
    user_domain_id: Option<String>,
    user_domain_name: Option<String>,
    project_domain_id: Option<String>,
    project_domain_name: Option<String>,
    application_credential_id: Option<String>,
    application_credential_name: Option<String>,
    application_credential_secret: Option<String>,
}

#[cfg(test)]
mod tests;
