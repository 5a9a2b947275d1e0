//! What a Service asks for: annotations over `[LoadBalancer]`, its ports, and the names of what
//! is made for it.

use std::{collections::BTreeMap, time::Duration};

use k8s_cloud_provider::{CloudError, CloudResult};
use k8s_openapi::api::core::v1::Service as KubeService;

use super::tls::{TlsSource, TlsTermination};
use crate::{OpenStackCloud, config::check_lb_method};

/// `loadbalancer.openstack.org/subnet-id`.
pub const ANNOTATION_SUBNET_ID: &str = "loadbalancer.openstack.org/subnet-id";
/// `loadbalancer.openstack.org/network-id`.
pub const ANNOTATION_NETWORK_ID: &str = "loadbalancer.openstack.org/network-id";
/// `loadbalancer.openstack.org/port-id`: an existing port to use as the VIP.
pub const ANNOTATION_PORT_ID: &str = "loadbalancer.openstack.org/port-id";
/// `loadbalancer.openstack.org/floating-network-id`.
pub const ANNOTATION_FLOATING_NETWORK_ID: &str = "loadbalancer.openstack.org/floating-network-id";
/// `loadbalancer.openstack.org/floating-subnet-id`: the subnet of the floating network a new
/// floating IP comes from.
pub const ANNOTATION_FLOATING_SUBNET_ID: &str = "loadbalancer.openstack.org/floating-subnet-id";
/// `loadbalancer.openstack.org/member-subnet-id`: the subnet of the members.
pub const ANNOTATION_MEMBER_SUBNET_ID: &str = "loadbalancer.openstack.org/member-subnet-id";
/// `loadbalancer.openstack.org/connection-limit`: the listeners' connection limit (-1: none).
pub const ANNOTATION_CONNECTION_LIMIT: &str = "loadbalancer.openstack.org/connection-limit";
/// `loadbalancer.openstack.org/proxy-protocol`: `true`/`v1` (PROXY) or `v2` (PROXYV2) pools.
pub const ANNOTATION_PROXY_PROTOCOL: &str = "loadbalancer.openstack.org/proxy-protocol";
/// `loadbalancer.openstack.org/timeout-client-data` (milliseconds).
pub const ANNOTATION_TIMEOUT_CLIENT_DATA: &str = "loadbalancer.openstack.org/timeout-client-data";
/// `loadbalancer.openstack.org/timeout-member-connect` (milliseconds).
pub const ANNOTATION_TIMEOUT_MEMBER_CONNECT: &str = "loadbalancer.openstack.org/timeout-member-connect";
/// `loadbalancer.openstack.org/timeout-member-data` (milliseconds).
pub const ANNOTATION_TIMEOUT_MEMBER_DATA: &str = "loadbalancer.openstack.org/timeout-member-data";
/// `loadbalancer.openstack.org/timeout-tcp-inspect` (milliseconds).
pub const ANNOTATION_TIMEOUT_TCP_INSPECT: &str = "loadbalancer.openstack.org/timeout-tcp-inspect";
/// `loadbalancer.openstack.org/health-monitor-delay` (seconds).
pub const ANNOTATION_HEALTH_MONITOR_DELAY: &str = "loadbalancer.openstack.org/health-monitor-delay";
/// `loadbalancer.openstack.org/health-monitor-timeout` (seconds).
pub const ANNOTATION_HEALTH_MONITOR_TIMEOUT: &str = "loadbalancer.openstack.org/health-monitor-timeout";
/// `loadbalancer.openstack.org/health-monitor-max-retries`.
pub const ANNOTATION_HEALTH_MONITOR_MAX_RETRIES: &str =
    "loadbalancer.openstack.org/health-monitor-max-retries";
/// `loadbalancer.openstack.org/health-monitor-max-retries-down`.
pub const ANNOTATION_HEALTH_MONITOR_MAX_RETRIES_DOWN: &str =
    "loadbalancer.openstack.org/health-monitor-max-retries-down";
/// `loadbalancer.openstack.org/hostname`: the status shows this hostname instead of the address.
pub const ANNOTATION_HOSTNAME: &str = "loadbalancer.openstack.org/hostname";
/// `loadbalancer.openstack.org/lb-method`.
pub const ANNOTATION_LB_METHOD: &str = "loadbalancer.openstack.org/lb-method";
/// `loadbalancer.openstack.org/enable-health-monitor`.
pub const ANNOTATION_HEALTH_MONITOR: &str = "loadbalancer.openstack.org/enable-health-monitor";
/// `loadbalancer.openstack.org/keep-floatingip`.
pub const ANNOTATION_KEEP_FLOATING_IP: &str = "loadbalancer.openstack.org/keep-floatingip";
/// `loadbalancer.openstack.org/flavor-id`.
pub const ANNOTATION_FLAVOR_ID: &str = "loadbalancer.openstack.org/flavor-id";
/// `loadbalancer.openstack.org/availability-zone`.
pub const ANNOTATION_AVAILABILITY_ZONE: &str = "loadbalancer.openstack.org/availability-zone";
/// `loadbalancer.openstack.org/load-balancer-id`: the Octavia load balancer this Service uses:
/// its own (found by name otherwise) or another Service's, shared (`max-shared-lb`).
pub const ANNOTATION_LOAD_BALANCER_ID: &str = "loadbalancer.openstack.org/load-balancer-id";
/// `loadbalancer.openstack.org/load-balancer-address`: written (as OCCM) with the Service's
/// address, which the status does not show when it shows the `…/hostname`.
pub const ANNOTATION_LOAD_BALANCER_ADDRESS: &str = "loadbalancer.openstack.org/load-balancer-address";
/// `loadbalancer.openstack.org/node-selector`: `key=value,key2` labels a Node needs to be a
/// member (`key` alone: any value).
pub const ANNOTATION_NODE_SELECTOR: &str = "loadbalancer.openstack.org/node-selector";
/// `loadbalancer.openstack.org/x-forwarded-for`: HTTP listeners that add `X-Forwarded-For`.
pub const ANNOTATION_X_FORWARDED_FOR: &str = "loadbalancer.openstack.org/x-forwarded-for";
/// `loadbalancer.openstack.org/class`: a `[LoadBalancerClass "<name>"]` of the config.
pub const ANNOTATION_CLASS: &str = "loadbalancer.openstack.org/class";
/// `loadbalancer.openstack.org/floating-subnet`: a name pattern of floating subnets
/// ([`super::FloatingSubnetSpec`]).
pub const ANNOTATION_FLOATING_SUBNET: &str = "loadbalancer.openstack.org/floating-subnet";
/// `loadbalancer.openstack.org/floating-subnet-tags`: a tag expression of floating subnets.
pub const ANNOTATION_FLOATING_SUBNET_TAGS: &str = "loadbalancer.openstack.org/floating-subnet-tags";
/// `loadbalancer.openstack.org/default-tls-container-ref`: the certificate (a barbican secret
/// or container) the Service's TCP ports terminate TLS with ([`super::tls`]); set and empty, no
/// TLS termination even when `[LoadBalancer]` names a default (OCCM).
pub const ANNOTATION_TLS_CONTAINER_REF: &str = "loadbalancer.openstack.org/default-tls-container-ref";
/// `service.beta.kubernetes.io/openstack-internal-load-balancer`.
pub const ANNOTATION_INTERNAL: &str = "service.beta.kubernetes.io/openstack-internal-load-balancer";

/// How long to wait for Octavia to finish one change, unless `OCCM_WAIT_LB_ACTIVE_STEPS` says
/// otherwise (see [`provisioning_timeout`]).
pub const PROVISIONING_TIMEOUT: Duration = Duration::from_secs(300);

/// The environment variable OCCM reads for how long to wait for a load balancer to be
/// `ACTIVE`: a number of back-off steps (1 s, growing by 1.2 each step; OCCM's default 23 steps
/// are about 326 s).
pub const WAIT_LB_ACTIVE_STEPS_ENV: &str = "OCCM_WAIT_LB_ACTIVE_STEPS";

/// The wait for Octavia to finish one change: with `steps` (the value of
/// [`WAIT_LB_ACTIVE_STEPS_ENV`]) OCCM's back-off's total, `1 s × (1.2^steps − 1) / 0.2`; without,
/// [`PROVISIONING_TIMEOUT`]. A value that is no positive whole number is an error naming it.
pub fn provisioning_timeout(steps: Option<&str>) -> Result<Duration, String> {
    let Some(v) = steps else {
        return Ok(PROVISIONING_TIMEOUT);
    };
    match v.trim().parse::<u32>() {
        Ok(n) if (1..=100).contains(&n) => Ok(Duration::from_secs_f64((1.2f64.powi(n as i32) - 1.0) / 0.2)),
        _ => Err(format!(
            "{WAIT_LB_ACTIVE_STEPS_ENV}={v:?}: not a number of steps from 1 to 100"
        )),
    }
}

/// Octavia and neutron names are at most 255 characters.
pub(super) fn cut(s: String) -> String {
    if s.len() <= 255 {
        return s;
    }
    let mut end = 255;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// What OCCM's load balancer names start with.
pub const SERVICE_PREFIX: &str = "kube_service_";

/// The legacy name (the in-tree provider's, and OCCM's before the `kube_service_` names):
/// `a` and the Service's UID without dashes, at most 32 characters. Found when no load
/// balancer has the current name; `None` for a Service without a UID.
pub fn legacy_load_balancer_name(service: &KubeService) -> Option<String> {
    let uid = service.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
    let mut name = format!("a{}", uid.replace('-', ""));
    name.truncate(32);
    Some(name)
}

/// `key=value,key2` as a map (`key2` with an empty value: any value); OCCM's reading.
pub fn parse_node_selector(text: &str) -> BTreeMap<String, String> {
    text.trim()
        .split(',')
        .filter_map(|kv| {
            let mut it = kv.trim().splitn(2, '=');
            let k = it.next().unwrap_or_default();
            if k.is_empty() {
                return None;
            }
            Some((k.to_string(), it.next().unwrap_or_default().to_string()))
        })
        .collect()
}

/// Whether the Node has every label of `selector` (an empty value: any value).
pub fn node_matches(node: &k8s_openapi::api::core::v1::Node, selector: &BTreeMap<String, String>) -> bool {
    if selector.is_empty() {
        return true;
    }
    let Some(labels) = node.metadata.labels.as_ref() else {
        return false;
    };
    selector
        .iter()
        .all(|(k, v)| labels.get(k).is_some_and(|have| v.is_empty() || have == v))
}

/// The load balancer's name: `kube_service_<cluster>_<namespace>_<name>`.
pub fn load_balancer_name(cluster: &str, service: &KubeService) -> String {
    cut(format!(
        "kube_service_{cluster}_{}_{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    ))
}

/// What a Service asks for, from its annotations and `[LoadBalancer]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceOptions {
    /// VIP subnet (and the members' when no member subnet is set).
    pub subnet_id: String,
    /// The members' subnet.
    pub member_subnet_id: String,
    /// VIP network.
    pub network_id: String,
    /// VIP port.
    pub port_id: String,
    /// Floating IP network (empty: none).
    pub floating_network_id: String,
    /// Floating IP subnet (nothing set: neutron chooses).
    pub floating_subnet: super::FloatingSubnetSpec,
    /// No floating IP.
    pub internal: bool,
    /// Pool algorithm.
    pub lb_method: String,
    /// Health monitors on.
    pub health_monitor: bool,
    /// Keep the floating IP when the Service goes.
    pub keep_floating_ip: bool,
    /// Octavia flavor.
    pub flavor_id: String,
    /// Octavia availability zone.
    pub availability_zone: String,
    /// Listener fields the annotations set (`connection_limit` always: -1 without one).
    pub listener_settings: Vec<(&'static str, i64)>,
    /// The pools' protocol for PROXY protocol (`PROXY`, `PROXYV2`), if asked for.
    pub proxy_protocol: Option<&'static str>,
    /// Health monitor `(delay s, timeout s, max_retries, max_retries_down)`.
    pub monitor: (u64, u64, u32, u32),
    /// The hostname the status shows, if asked for.
    pub hostname: Option<String>,
    /// With PROXY protocol and `enable-ingress-hostname`: the suffix of the status hostname
    /// `<address>.<suffix>`.
    pub ingress_hostname_suffix: Option<String>,
    /// The load balancer named by `load-balancer-id`, if any.
    pub load_balancer_id: Option<String>,
    /// The labels a member Node needs (empty: every Node).
    pub node_selector: BTreeMap<String, String>,
    /// HTTP listeners with `X-Forwarded-For` (`x-forwarded-for`).
    pub keep_client_ip: bool,
    /// TLS termination (`default-tls-container-ref`), if asked for.
    pub tls: Option<TlsTermination>,
    /// The pools' session persistence: `SOURCE_IP` for `sessionAffinity: ClientIP` (OCCM).
    pub session_persistence: Option<&'static str>,
    /// `externalTrafficPolicy: Local` with health monitors on: the Service's
    /// `healthCheckNodePort`, checked over HTTP (`GET /healthz`) on each member.
    pub health_check_node_port: Option<i32>,
}

/// One Service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// The Service port.
    pub port: i32,
    /// The NodePort (0: none, with `allocateLoadBalancerNodePorts: false`; no members).
    pub node_port: i32,
}

pub(super) fn annotation<'a>(service: &'a KubeService, key: &str) -> Option<&'a str> {
    service
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

pub(super) fn annotation_bool(service: &KubeService, key: &str, default: bool) -> CloudResult<bool> {
    match annotation(service, key) {
        None => Ok(default),
        Some(v) => k8s_cloud_provider::service::helpers::parse_go_bool(v)
            .ok_or_else(|| CloudError::msg(format!("annotation {key}: {v:?} is not a boolean (true/false)"))),
    }
}

/// An integer annotation (`default` without it); below `min` is an error naming it.
fn number(service: &KubeService, key: &str, default: i64, min: i64) -> CloudResult<i64> {
    match annotation(service, key).map(str::trim) {
        None => Ok(default),
        Some(v) => match v.parse::<i64>() {
            Ok(n) if n >= min && n <= i64::from(i32::MAX) => Ok(n),
            _ => Err(CloudError::msg(format!(
                "annotation {key}: {v:?} is not a whole number of at least {min}"
            ))),
        },
    }
}

/// The listener fields the annotations set: `connection_limit` (-1 without the annotation, or
/// -1 itself: unlimited) and each timeout that is annotated.
fn listener_settings(service: &KubeService) -> CloudResult<Vec<(&'static str, i64)>> {
    let limit = number(service, ANNOTATION_CONNECTION_LIMIT, -1, -1)?;
    if limit == 0 {
        return Err(CloudError::msg(format!(
            "annotation {ANNOTATION_CONNECTION_LIMIT}: 0 is not a limit (a positive number, or -1 for none)"
        )));
    }
    let mut out = vec![("connection_limit", limit)];
    for (key, field) in [
        (ANNOTATION_TIMEOUT_CLIENT_DATA, "timeout_client_data"),
        (ANNOTATION_TIMEOUT_MEMBER_CONNECT, "timeout_member_connect"),
        (ANNOTATION_TIMEOUT_MEMBER_DATA, "timeout_member_data"),
        (ANNOTATION_TIMEOUT_TCP_INSPECT, "timeout_tcp_inspect"),
    ] {
        if annotation(service, key).is_some() {
            out.push((field, number(service, key, 0, 0)?));
        }
    }
    Ok(out)
}

/// The floating subnet, as OCCM chooses it: the class's (its ID, else its name pattern and
/// tags), else the annotations' (the same way), else `[LoadBalancer]`'s. A bad name pattern is
/// an error naming where it comes from.
fn floating_subnet(
    service: &KubeService,
    c: &crate::config::LoadBalancerOptions,
    class: Option<&crate::config::LoadBalancerClass>,
) -> CloudResult<super::FloatingSubnetSpec> {
    let spec = |id: &str, pattern: &str, tags: &str| super::FloatingSubnetSpec {
        id: id.trim().to_string(),
        pattern: if id.trim().is_empty() {
            pattern.trim().to_string()
        } else {
            String::new()
        },
        tags: if id.trim().is_empty() {
            tags.trim().to_string()
        } else {
            String::new()
        },
    };
    let (chosen, source) =
        match class.map(|k| spec(&k.floating_subnet_id, &k.floating_subnet, &k.floating_subnet_tags)) {
            Some(s) if s.is_set() => (s, format!("annotation {ANNOTATION_CLASS}'s [LoadBalancerClass]")),
            _ => {
                let from_annotations = spec(
                    annotation(service, ANNOTATION_FLOATING_SUBNET_ID).unwrap_or_default(),
                    annotation(service, ANNOTATION_FLOATING_SUBNET).unwrap_or_default(),
                    annotation(service, ANNOTATION_FLOATING_SUBNET_TAGS).unwrap_or_default(),
                );
                if from_annotations.is_set() {
                    (
                        from_annotations,
                        format!("annotation {ANNOTATION_FLOATING_SUBNET}"),
                    )
                } else {
                    (
                        spec(&c.floating_subnet_id, &c.floating_subnet, &c.floating_subnet_tags),
                        "[LoadBalancer] floating-subnet".to_string(),
                    )
                }
            }
        };
    chosen
        .matcher()
        .map_err(|m| CloudError::msg(format!("{source}: {m}")))?;
    Ok(chosen)
}

impl ServiceOptions {
    /// Reads the annotations over the configured defaults.
    pub fn from_service(cloud: &OpenStackCloud, service: &KubeService) -> CloudResult<Self> {
        let c = &cloud.config.load_balancer;
        let text = |key: &str, default: &str| annotation(service, key).unwrap_or(default).trim().to_string();
        let lb_method = match annotation(service, ANNOTATION_LB_METHOD) {
            Some(v) => check_lb_method(v)
                .map_err(|m| CloudError::msg(format!("annotation {ANNOTATION_LB_METHOD}: {m}")))?,
            None => c.lb_method.clone(),
        };
        let tls = match annotation(service, ANNOTATION_TLS_CONTAINER_REF) {
            Some(v) => Some((v.trim(), TlsSource::Annotation)),
            None => Some((c.tls_container_ref.as_str(), TlsSource::Config)),
        }
        .filter(|(r, _)| !r.is_empty())
        .map(|(reference, source)| TlsTermination {
            reference: reference.to_string(),
            source,
        });
        if let Some(t) = &tls
            && c.container_store == crate::config::ContainerStore::Barbican
        {
            super::tls::barbican_reference(&t.reference)
                .map_err(|m| CloudError::msg(format!("{}: {m}", t.source)))?;
        }
        // A `[LoadBalancerClass]` comes between the annotations and `[LoadBalancer]`.
        let class = match annotation(service, ANNOTATION_CLASS).map(str::trim) {
            None | Some("") => None,
            Some(name) => Some(c.classes.get(name).ok_or_else(|| {
                CloudError::msg(format!(
                    "annotation {ANNOTATION_CLASS}: {name:?} is no [LoadBalancerClass] of the cloud config ({})",
                    if c.classes.is_empty() {
                        "it has none".to_string()
                    } else {
                        c.classes.keys().cloned().collect::<Vec<_>>().join(", ")
                    }
                ))
            })?),
        };
        let from_class = |pick: fn(&crate::config::LoadBalancerClass) -> &String, default: &str| -> String {
            class
                .map(pick)
                .filter(|v| !v.is_empty())
                .cloned()
                .unwrap_or_else(|| default.to_string())
        };
        // As OCCM: `internal-lb = true` keeps every Service internal, whatever it asks for (an
        // annotation can make a Service internal, never expose one the cloud's admin keeps in).
        let asked_internal = annotation_bool(service, ANNOTATION_INTERNAL, c.internal_lb)?;
        if c.internal_lb && !asked_internal {
            tracing::info!(
                annotation = ANNOTATION_INTERNAL,
                "[LoadBalancer] internal-lb = true: the Service stays internal (no floating IP) though its annotation says false"
            );
        }
        let internal = c.internal_lb || asked_internal;
        let keep_client_ip = annotation_bool(service, ANNOTATION_X_FORWARDED_FOR, false)?;
        let health_monitor = annotation_bool(service, ANNOTATION_HEALTH_MONITOR, c.monitor.create)?;
        let spec = service.spec.as_ref();
        let health_check_node_port = spec
            .filter(|s| s.external_traffic_policy.as_deref() == Some("Local"))
            .and_then(|s| s.health_check_node_port)
            .filter(|p| health_monitor && *p > 0);
        let o = Self {
            subnet_id: text(ANNOTATION_SUBNET_ID, &from_class(|k| &k.subnet_id, &c.subnet_id)),
            member_subnet_id: text(
                ANNOTATION_MEMBER_SUBNET_ID,
                &from_class(|k| &k.member_subnet_id, &c.member_subnet_id),
            ),
            network_id: text(
                ANNOTATION_NETWORK_ID,
                &from_class(|k| &k.network_id, &c.network_id),
            ),
            port_id: text(ANNOTATION_PORT_ID, ""),
            // As OCCM: the class's floating network and subnet come before the annotations.
            floating_network_id: class
                .map(|k| k.floating_network_id.clone())
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| text(ANNOTATION_FLOATING_NETWORK_ID, &c.floating_network_id)),
            floating_subnet: floating_subnet(service, c, class)?,
            internal,
            lb_method,
            health_monitor,
            keep_floating_ip: annotation_bool(service, ANNOTATION_KEEP_FLOATING_IP, false)?,
            flavor_id: text(ANNOTATION_FLAVOR_ID, &c.flavor_id),
            availability_zone: text(ANNOTATION_AVAILABILITY_ZONE, &c.availability_zone),
            listener_settings: listener_settings(service)?,
            proxy_protocol: match annotation(service, ANNOTATION_PROXY_PROTOCOL).map(str::trim) {
                None | Some("false") => None,
                Some("true" | "v1") => Some("PROXY"),
                Some("v2") => Some("PROXYV2"),
                Some(v) => {
                    return Err(CloudError::msg(format!(
                        "annotation {ANNOTATION_PROXY_PROTOCOL}: {v:?} is not true, v1, v2 or false"
                    )));
                }
            },
            monitor: (
                number(
                    service,
                    ANNOTATION_HEALTH_MONITOR_DELAY,
                    c.monitor.delay.as_secs().max(1) as i64,
                    1,
                )? as u64,
                number(
                    service,
                    ANNOTATION_HEALTH_MONITOR_TIMEOUT,
                    c.monitor.timeout.as_secs().max(1) as i64,
                    1,
                )? as u64,
                number(
                    service,
                    ANNOTATION_HEALTH_MONITOR_MAX_RETRIES,
                    i64::from(c.monitor.max_retries.max(1)),
                    1,
                )? as u32,
                number(
                    service,
                    ANNOTATION_HEALTH_MONITOR_MAX_RETRIES_DOWN,
                    i64::from(c.monitor.max_retries_down.max(1)),
                    1,
                )? as u32,
            ),
            hostname: annotation(service, ANNOTATION_HOSTNAME)
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(str::to_string),
            load_balancer_id: annotation(service, ANNOTATION_LOAD_BALANCER_ID)
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_string),
            node_selector: parse_node_selector(
                annotation(service, ANNOTATION_NODE_SELECTOR).unwrap_or(&c.node_selector),
            ),
            keep_client_ip,
            tls,
            health_check_node_port,
            session_persistence: spec
                .and_then(|s| s.session_affinity.as_deref())
                .filter(|a| *a == "ClientIP")
                .map(|_| "SOURCE_IP"),
            ingress_hostname_suffix: None,
        };
        let o = Self {
            ingress_hostname_suffix: (c.enable_ingress_hostname && o.proxy_protocol.is_some()).then(|| {
                c.ingress_hostname_suffix
                    .trim()
                    .trim_start_matches('.')
                    .to_string()
            }),
            ..o
        };
        if o.keep_client_ip && o.proxy_protocol.is_some() {
            return Err(CloudError::msg(format!(
                "annotations {ANNOTATION_PROXY_PROTOCOL} and {ANNOTATION_X_FORWARDED_FOR} cannot be used together"
            )));
        }
        Ok(o)
    }

    /// The listener protocol of a Service port (OCCM): `TERMINATED_HTTPS` for a TCP port with a
    /// TLS certificate, `HTTP` for one with `x-forwarded-for`, else the port's. (OCCM would ask
    /// Octavia for `TERMINATED_HTTPS` on a UDP port too, which Octavia refuses; a UDP or SCTP
    /// port keeps its protocol here.)
    pub fn listener_protocol<'a>(&self, port: &'a PortSpec) -> &'a str {
        if port.protocol != "TCP" {
            &port.protocol
        } else if self.tls.is_some() {
            "TERMINATED_HTTPS"
        } else if self.keep_client_ip {
            "HTTP"
        } else {
            &port.protocol
        }
    }

    /// The pool protocol of a Service port: `PROXY`/`PROXYV2` with `proxy-protocol`, `HTTP`
    /// behind a TLS-terminating or `x-forwarded-for` listener (OCCM), else the port's.
    pub fn pool_protocol<'a>(&self, port: &'a PortSpec) -> &'a str {
        match self.proxy_protocol {
            Some(p) => p,
            None if port.protocol == "TCP" && (self.tls.is_some() || self.keep_client_ip) => "HTTP",
            None => &port.protocol,
        }
    }

    /// The listener's certificate reference for a Service port (TCP ports with TLS termination).
    pub fn listener_tls_reference(&self, port: &PortSpec) -> Option<&str> {
        self.tls
            .as_ref()
            .filter(|_| port.protocol == "TCP")
            .map(|t| t.reference.as_str())
    }

    /// The hostname the status shows for `address`: the `hostname` annotation's, else with
    /// PROXY protocol and `enable-ingress-hostname` `<address>.<suffix>` (OCCM), else none.
    pub fn status_hostname(&self, address: &str) -> Option<String> {
        self.hostname.clone().or_else(|| {
            self.ingress_hostname_suffix
                .as_ref()
                .map(|suffix| format!("{address}.{suffix}"))
        })
    }

    /// The subnet of the members: `member-subnet-id`, else the VIP subnet.
    pub fn members_subnet(&self) -> &str {
        if self.member_subnet_id.is_empty() {
            &self.subnet_id
        } else {
            &self.member_subnet_id
        }
    }
}

/// The Service's ports; an unsupported protocol or a port without NodePort is an error.
pub fn service_ports(service: &KubeService) -> CloudResult<Vec<PortSpec>> {
    let ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .cloned()
        .unwrap_or_default();
    if ports.is_empty() {
        return Err(CloudError::msg("the Service has no ports"));
    }
    // `allocateLoadBalancerNodePorts: false`: ports without a NodePort get listeners and pools
    // without members (as OCCM; something else sends the traffic on, e.g. to Pod IPs).
    let node_ports_allocated = service
        .spec
        .as_ref()
        .and_then(|s| s.allocate_load_balancer_node_ports)
        != Some(false);
    ports
        .iter()
        .map(|p| {
            let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
            if !matches!(protocol.as_str(), "TCP" | "UDP" | "SCTP") {
                return Err(CloudError::msg(format!(
                    "spec.ports[{}].protocol {protocol:?} is not supported (TCP, UDP, SCTP)",
                    p.name.as_deref().unwrap_or_default()
                )));
            }
            let node_port = match p.node_port.filter(|n| *n > 0) {
                Some(n) => n,
                None if !node_ports_allocated => 0,
                None => {
                    return Err(CloudError::msg(format!(
                        "spec.ports port {} has no nodePort yet",
                        p.port
                    )));
                }
            };
            Ok(PortSpec {
                protocol,
                port: p.port,
                node_port,
            })
        })
        .collect()
}

/// Whether the Service's primary IP family is IPv6 (`spec.ipFamilies[0]`, else its cluster
/// IP's family; IPv4 when neither says).
pub fn service_wants_ipv6(service: &KubeService) -> bool {
    let spec = service.spec.as_ref();
    if let Some(first) = spec.and_then(|s| s.ip_families.as_ref()).and_then(|f| f.first()) {
        return first == "IPv6";
    }
    spec.and_then(|s| s.cluster_ip.as_deref())
        .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
        .is_some_and(|ip| ip.is_ipv6())
}

/// The address a Node's member gets: its first InternalIP of the family (`ipv6`), else its
/// first ExternalIP of the family (OCCM's `nodeAddressForLB`).
pub fn member_address(node: &k8s_openapi::api::core::v1::Node, ipv6: bool) -> Option<String> {
    super::node_address_for_subnet(node, ipv6)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_load_balancer_wait_follows_occms_steps() {
        assert_eq!(provisioning_timeout(None), Ok(PROVISIONING_TIMEOUT));
        let three = provisioning_timeout(Some("3")).unwrap();
        assert!((three.as_secs_f64() - 3.64).abs() < 0.01, "{three:?}");
        let default = provisioning_timeout(Some("23")).unwrap();
        assert!((320.0..330.0).contains(&default.as_secs_f64()), "{default:?}");
        for bad in ["0", "-1", "x", "101", ""] {
            let e = provisioning_timeout(Some(bad)).unwrap_err();
            assert!(e.contains("OCCM_WAIT_LB_ACTIVE_STEPS"), "{e}");
        }
    }

    use super::*;
    use k8s_openapi::{
        api::core::v1::{ServicePort, ServiceSpec},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };

    fn svc(ports: Vec<ServicePort>) -> KubeService {
        KubeService {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(ports),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn names_and_ports() {
        let s = svc(vec![ServicePort {
            port: 80,
            node_port: Some(30080),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]);
        assert_eq!(
            load_balancer_name("kubernetes", &s),
            "kube_service_kubernetes_shop_web"
        );
        assert_eq!(
            service_ports(&s).unwrap(),
            [PortSpec {
                protocol: "TCP".into(),
                port: 80,
                node_port: 30080
            }]
        );
        assert_eq!(cut("x".repeat(300)).len(), 255);
        let bad = svc(vec![ServicePort {
            port: 80,
            node_port: Some(30080),
            protocol: Some("HTTP".into()),
            ..Default::default()
        }]);
        assert!(service_ports(&bad).unwrap_err().to_string().contains("HTTP"));
        assert!(service_ports(&svc(vec![])).is_err());
    }

    #[test]
    fn legacy_names_and_node_selectors() {
        let mut s = svc(vec![]);
        assert_eq!(legacy_load_balancer_name(&s), None, "no UID, no legacy name");
        s.metadata.uid = Some("0f8e4c3a-91d2-4b7e-a6c5-3d2f1e0b9a87".into());
        // `a` and the UID without dashes, cut to 32 characters (cloudprovider.DefaultLoadBalancerName).
        assert_eq!(
            legacy_load_balancer_name(&s).as_deref(),
            Some("a0f8e4c3a91d24b7ea6c53d2f1e0b9a8")
        );
        let sel = parse_node_selector(" env=prod, lb ,,zone=a=b");
        assert_eq!(
            sel.into_iter().collect::<Vec<_>>(),
            [
                ("env".to_string(), "prod".to_string()),
                ("lb".to_string(), String::new()),
                ("zone".to_string(), "a=b".to_string())
            ]
        );
        let node = |labels: &[(&str, &str)]| k8s_openapi::api::core::v1::Node {
            metadata: ObjectMeta {
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        let sel = parse_node_selector("env=prod,lb");
        assert!(node_matches(&node(&[("env", "prod"), ("lb", "yes")]), &sel));
        assert!(!node_matches(&node(&[("env", "dev"), ("lb", "yes")]), &sel));
        assert!(!node_matches(&node(&[("env", "prod")]), &sel));
        assert!(
            node_matches(&node(&[]), &parse_node_selector("")),
            "no selector: every Node"
        );
    }

    #[test]
    fn members_take_the_services_ip_family() {
        use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus};
        let node = Node {
            status: Some(NodeStatus {
                addresses: Some(
                    [
                        ("ExternalIP", "2001:db8::9"),
                        ("InternalIP", "fd00::5"),
                        ("InternalIP", "10.0.0.5"),
                    ]
                    .iter()
                    .map(|(t, a)| NodeAddress {
                        type_: t.to_string(),
                        address: a.to_string(),
                    })
                    .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(member_address(&node, false).as_deref(), Some("10.0.0.5"));
        assert_eq!(member_address(&node, true).as_deref(), Some("fd00::5"));
        let mut s = svc(vec![]);
        assert!(!service_wants_ipv6(&s), "IPv4 when nothing says");
        s.spec.as_mut().unwrap().cluster_ip = Some("fd00:10::1".into());
        assert!(service_wants_ipv6(&s), "the cluster IP's family");
        s.spec.as_mut().unwrap().ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
        assert!(!service_wants_ipv6(&s), "ipFamilies[0] first");
    }
}
