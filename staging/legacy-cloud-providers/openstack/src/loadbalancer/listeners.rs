//! A Service's listeners on its load balancer (its own or a shared one), each with its pool,
//! members and health monitor, as OCCM makes them: one listener per Service port (matched by
//! protocol and port, named `listener_<i>_<lb>`, tagged with the Service's load balancer
//! name), its default pool (`pool_<i>_<lb>`), one member per Node, an optional monitor
//! (`monitor_<i>_<lb>`). On a shared load balancer a Service touches only its own listeners:
//! tagged with its name, or (on its own load balancer) untagged, made before tags.

use std::collections::BTreeSet;

use k8s_cloud_provider::{CloudError, CloudResult};
use serde_json::{Value, json};

use super::{ensure::Members, octavia::*, options::*};
use crate::{OpenStackCloud, client::Service, cloud_error};

/// Octavia's listener timeouts and OCCM's values for them (ms) when not annotated.
const TIMEOUT_DEFAULTS: [(&str, i64); 4] = [
    ("timeout_client_data", 50_000),
    ("timeout_member_connect", 5_000),
    ("timeout_member_data", 50_000),
    ("timeout_tcp_inspect", 0),
];

/// One member as compared: `(name, address, port, subnet, monitor port)`.
type MemberKey = (String, String, i32, String, Option<i32>);

/// Whether a listener is the Service's (`name`): tagged with its name, or untagged on its own
/// load balancer.
pub(super) fn is_services_listener(l: &Listener, name: &str, owner: bool) -> bool {
    l.tags.iter().any(|t| t == name) || (owner && l.tags.is_empty())
}

impl OpenStackCloud {
    /// Makes the Service's listeners match its ports; listeners of other Services are never
    /// changed, and one of theirs on a port this Service wants is an error.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn ensure_listeners(
        &self,
        lb: &OctaviaLoadBalancer,
        name: &str,
        owner: bool,
        ports: &[PortSpec],
        opts: &ServiceOptions,
        allowed_cidrs: &[String],
        members: &Members,
        tags: bool,
    ) -> CloudResult<()> {
        let listeners = self.listeners_of(&lb.id).await?;
        let wanted: Vec<(&str, i32)> = ports
            .iter()
            .map(|p| (opts.listener_protocol(p), p.port))
            .collect();
        // A port another Service listens on (OCCM's checkListenerPorts).
        for l in &listeners {
            if !is_services_listener(l, name, owner)
                && ports
                    .iter()
                    .any(|p| p.port == l.protocol_port && same_layer4(&l.protocol, opts.listener_protocol(p)))
            {
                return Err(CloudError::msg(format!(
                    "port {} of load balancer {} is taken by listener {} of another Service ({})",
                    l.protocol_port,
                    lb.id,
                    l.id,
                    if l.tags.is_empty() {
                        "untagged".to_string()
                    } else {
                        l.tags.join(", ")
                    }
                )));
            }
        }
        // The Service's listeners it no longer wants go first (a port whose listener protocol
        // changed, e.g. x-forwarded-for switched on, is free for the new one): pool first (its
        // members and monitor go with it), then the listener.
        for l in listeners.iter().filter(|l| {
            is_services_listener(l, name, owner) && !wanted.contains(&(l.protocol.as_str(), l.protocol_port))
        }) {
            self.delete_listener(&lb.id, l).await?;
            tracing::info!(listener = %l.id, protocol = %l.protocol, port = l.protocol_port, "deleted a listener the Service no longer has");
        }

        let mut settings = opts.listener_settings.clone();
        if self.octavia_supports(OctaviaFeature::Timeouts).await? {
            for (field, default) in TIMEOUT_DEFAULTS {
                if !settings.iter().any(|(f, _)| *f == field) {
                    settings.push((field, default));
                }
            }
        } else {
            settings.retain(|(f, _)| !f.starts_with("timeout_"));
        }
        for (i, port) in ports.iter().enumerate() {
            let protocol = opts.listener_protocol(port);
            let existing = listeners.iter().find(|l| {
                l.protocol == protocol && l.protocol_port == port.port && is_services_listener(l, name, owner)
            });
            let listener = match existing {
                Some(l) => {
                    // One update with every field that differs.
                    let mut change = serde_json::Map::new();
                    let current = l.allowed_cidrs.clone().unwrap_or_default();
                    if current.iter().collect::<BTreeSet<_>>()
                        != allowed_cidrs.iter().collect::<BTreeSet<_>>()
                    {
                        change.insert(
                            "allowed_cidrs".into(),
                            if allowed_cidrs.is_empty() {
                                Value::Null
                            } else {
                                json!(allowed_cidrs)
                            },
                        );
                    }
                    for (field, want) in &settings {
                        if l.settings.get(*field).and_then(Value::as_i64) != Some(*want) {
                            change.insert((*field).into(), json!(want));
                        }
                    }
                    if tags && !l.tags.iter().any(|t| t == name) {
                        let mut all = l.tags.clone();
                        all.push(name.to_string());
                        change.insert("tags".into(), json!(all));
                    }
                    if let Some(reference) = opts.listener_tls_reference(port)
                        && l.default_tls_container_ref.as_deref() != Some(reference)
                    {
                        // A new certificate (OCCM updates it in place).
                        change.insert("default_tls_container_ref".into(), json!(reference));
                    }
                    if protocol == "HTTP" || protocol == "TERMINATED_HTTPS" {
                        let has = l
                            .insert_headers
                            .as_ref()
                            .and_then(|h| h.get("X-Forwarded-For"))
                            .and_then(Value::as_str)
                            == Some("true");
                        if has != opts.keep_client_ip {
                            let mut headers = l.insert_headers.clone().unwrap_or_default();
                            if opts.keep_client_ip {
                                headers.insert("X-Forwarded-For".into(), json!("true"));
                            } else {
                                headers.remove("X-Forwarded-For");
                            }
                            change.insert("insert_headers".into(), Value::Object(headers));
                        }
                    }
                    if !change.is_empty() {
                        self.lb_put(
                            &lb.id,
                            &format!("{LBAAS}/listeners/{}", l.id),
                            json!({"listener": change}),
                            "listener",
                        )
                        .await?;
                    }
                    l.clone()
                }
                None => {
                    let mut body = json!({
                        "name": cut(format!("listener_{i}_{name}")),
                        "protocol": protocol,
                        "protocol_port": port.port,
                        "loadbalancer_id": lb.id,
                    });
                    if tags {
                        body["tags"] = json!([name]);
                    }
                    if !allowed_cidrs.is_empty() {
                        body["allowed_cidrs"] = json!(allowed_cidrs);
                    }
                    for (field, value) in &settings {
                        body[*field] = json!(value);
                    }
                    if opts.keep_client_ip && (protocol == "HTTP" || protocol == "TERMINATED_HTTPS") {
                        body["insert_headers"] = json!({"X-Forwarded-For": "true"});
                    }
                    if let Some(reference) = opts.listener_tls_reference(port) {
                        body["default_tls_container_ref"] = json!(reference);
                    }
                    let v = self
                        .lb_post(
                            &lb.id,
                            &format!("{LBAAS}/listeners"),
                            json!({"listener": body}),
                            "listener",
                        )
                        .await?;
                    crate::client::decode(&v, "listener", "listeners")
                        .map_err(|e| cloud_error("creating listener", e))?
                }
            };
            self.ensure_pool(lb, name, i, port, &listener, opts, members, tags)
                .await?;
        }
        Ok(())
    }

    /// The listener's default pool with its members and health monitor.
    #[allow(clippy::too_many_arguments)]
    async fn ensure_pool(
        &self,
        lb: &OctaviaLoadBalancer,
        name: &str,
        i: usize,
        port: &PortSpec,
        listener: &Listener,
        opts: &ServiceOptions,
        members: &Members,
        tags: bool,
    ) -> CloudResult<()> {
        let pool_protocol = opts.pool_protocol(port);
        let existing = match &listener.default_pool_id {
            Some(id) if !id.is_empty() => {
                let p: Pool = self
                    .client
                    .get_as(Service::LoadBalancer, &format!("{LBAAS}/pools/{id}"), "pool")
                    .await
                    .map_err(|e| cloud_error(format!("reading pool {id}"), e))?;
                if p.protocol != pool_protocol {
                    // Octavia cannot change a pool's protocol (PROXY protocol switched on or
                    // off): the pool is made again, as OCCM does.
                    self.lb_delete(&lb.id, &format!("{LBAAS}/pools/{id}"), "pool")
                        .await?;
                    tracing::info!(pool = %id, from = %p.protocol, to = pool_protocol, "pool protocol changed: pool made again");
                    None
                } else {
                    Some(p)
                }
            }
            _ => None,
        };
        let pool = match existing {
            Some(p) => {
                // Algorithm and session persistence follow the Service, in one update (OCCM
                // updates the algorithm only; a changed `sessionAffinity` is applied here too).
                let mut update = serde_json::Map::new();
                if p.lb_algorithm != opts.lb_method {
                    update.insert("lb_algorithm".into(), json!(opts.lb_method));
                }
                if p.persistence_type() != opts.session_persistence {
                    update.insert(
                        "session_persistence".into(),
                        opts.session_persistence
                            .map_or(serde_json::Value::Null, |t| json!({"type": t})),
                    );
                }
                if !update.is_empty() {
                    self.lb_put(
                        &lb.id,
                        &format!("{LBAAS}/pools/{}", p.id),
                        json!({"pool": update}),
                        "pool algorithm and session persistence",
                    )
                    .await?;
                }
                p
            }
            None => {
                let mut body = json!({
                    "name": cut(format!("pool_{i}_{name}")),
                    "protocol": pool_protocol,
                    "lb_algorithm": opts.lb_method,
                    "listener_id": listener.id,
                });
                if let Some(t) = opts.session_persistence {
                    body["session_persistence"] = json!({"type": t});
                }
                if tags {
                    body["tags"] = json!([name]);
                }
                let v = self
                    .lb_post(&lb.id, &format!("{LBAAS}/pools"), json!({"pool": body}), "pool")
                    .await?;
                crate::client::decode(&v, "pool", "pools").map_err(|e| cloud_error("creating pool", e))?
            }
        };

        // Members: one batch update when the set differs. With an HTTP monitor on
        // `healthCheckNodePort` each member is checked on that port.
        let http_monitor = self.http_monitor_port(port, opts).await?;
        let current: Vec<Member> = self
            .client
            .list(
                Service::LoadBalancer,
                &format!("{LBAAS}/pools/{}/members", pool.id),
                "members",
            )
            .await
            .map_err(|e| cloud_error(format!("listing members of pool {}", pool.id), e))?;
        let have: BTreeSet<MemberKey> = current
            .iter()
            .map(|m| {
                (
                    m.name.clone(),
                    m.address.clone(),
                    m.protocol_port,
                    m.subnet_id.clone().unwrap_or_default(),
                    m.monitor_port,
                )
            })
            .collect();
        let want: BTreeSet<MemberKey> = members
            .by_node
            .iter()
            .filter(|_| port.node_port > 0)
            .map(|(n, ip)| {
                (
                    n.clone(),
                    ip.clone(),
                    port.node_port,
                    opts.members_subnet().to_string(),
                    http_monitor,
                )
            })
            .collect();
        if have != want {
            let body: Vec<Value> = want
                .iter()
                .map(|(n, ip, p, subnet, monitor)| {
                    let mut m = json!({"name": n, "address": ip, "protocol_port": p, "subnet_id": subnet});
                    if let Some(mp) = monitor {
                        m["monitor_port"] = json!(mp);
                    }
                    m
                })
                .collect();
            self.lb_put(
                &lb.id,
                &format!("{LBAAS}/pools/{}/members", pool.id),
                json!({"members": body}),
                "pool members",
            )
            .await?;
            tracing::info!(pool = %pool.id, members = want.len(), "updated load balancer members");
        }
        self.ensure_monitor(lb, name, i, port, &pool, opts, http_monitor)
            .await
    }

    /// `healthCheckNodePort` when the port's monitor is an HTTP one (`externalTrafficPolicy:
    /// Local` with monitors on, as OCCM: not with the OVN provider, and on UDP only from
    /// Octavia API 2.16).
    async fn http_monitor_port(&self, port: &PortSpec, opts: &ServiceOptions) -> CloudResult<Option<i32>> {
        let Some(hc) = opts.health_check_node_port else {
            return Ok(None);
        };
        if self.config.load_balancer.lb_provider == "ovn" {
            return Ok(None);
        }
        if port.protocol == "UDP" && !self.octavia_supports(OctaviaFeature::HttpMonitorsOnUdp).await? {
            return Ok(None);
        }
        Ok(Some(hc))
    }

    /// The pool's health monitor: made, updated (or made again when its type changes), or
    /// deleted as the options say.
    #[allow(clippy::too_many_arguments)]
    async fn ensure_monitor(
        &self,
        lb: &OctaviaLoadBalancer,
        name: &str,
        i: usize,
        port: &PortSpec,
        pool: &Pool,
        opts: &ServiceOptions,
        http_monitor: Option<i32>,
    ) -> CloudResult<()> {
        let (delay, timeout, max_retries, max_retries_down) = opts.monitor;
        let kind = if http_monitor.is_some() {
            "HTTP"
        } else if port.protocol == "UDP" {
            "UDP-CONNECT"
        } else if port.protocol == "SCTP" {
            "SCTP"
        } else {
            "TCP"
        };
        let mut want = json!({
            "name": cut(format!("monitor_{i}_{name}")),
            "type": kind,
            "delay": delay,
            "timeout": timeout,
            "max_retries": max_retries,
            "max_retries_down": max_retries_down,
        });
        if kind == "HTTP" {
            want["url_path"] = json!("/healthz");
            want["http_method"] = json!("GET");
            want["expected_codes"] = json!("200");
        }
        let existing = pool.healthmonitor_id.as_deref().filter(|id| !id.is_empty());
        match (existing, opts.health_monitor) {
            (None, false) => Ok(()),
            (None, true) => self.create_monitor(lb, pool, want).await,
            (Some(id), false) => {
                self.lb_delete(&lb.id, &format!("{LBAAS}/healthmonitors/{id}"), "health monitor")
                    .await
            }
            (Some(id), true) => {
                // Settings changed after the monitor was made (annotations or config).
                let path = format!("{LBAAS}/healthmonitors/{id}");
                let m: Value = self
                    .client
                    .get_as(Service::LoadBalancer, &path, "healthmonitor")
                    .await
                    .map_err(|e| cloud_error(format!("reading health monitor {id}"), e))?;
                if m["type"].as_str() != Some(kind) {
                    // Octavia cannot change a monitor's type: made again, as OCCM does.
                    self.lb_delete(&lb.id, &path, "health monitor").await?;
                    tracing::info!(monitor = %id, from = %m["type"], to = kind, "health monitor type changed: made again");
                    return self.create_monitor(lb, pool, want).await;
                }
                let differs = ["delay", "timeout", "max_retries", "max_retries_down"]
                    .iter()
                    .any(|k| m[*k].as_i64() != want[*k].as_i64());
                if differs {
                    let change = json!({"delay": delay, "timeout": timeout, "max_retries": max_retries, "max_retries_down": max_retries_down});
                    self.lb_put(&lb.id, &path, json!({"healthmonitor": change}), "health monitor")
                        .await?;
                }
                Ok(())
            }
        }
    }

    async fn create_monitor(
        &self,
        lb: &OctaviaLoadBalancer,
        pool: &Pool,
        mut body: Value,
    ) -> CloudResult<()> {
        body["pool_id"] = json!(pool.id);
        self.lb_post(
            &lb.id,
            &format!("{LBAAS}/healthmonitors"),
            json!({"healthmonitor": body}),
            "health monitor",
        )
        .await
        .map(|_| ())
    }
}

/// Whether two listener protocols share a transport port space (UDP and SCTP listeners each
/// have their own; every other is on TCP).
fn same_layer4(a: &str, b: &str) -> bool {
    let l4 = |p: &str| match p {
        "UDP" => "UDP",
        "SCTP" => "SCTP",
        _ => "TCP",
    };
    l4(a) == l4(b)
}
