//! An NLB's target groups (AWS-43 names, AWS-44 health checks, attributes), their
//! targets on the NodePort, and the sweep of target groups left over by earlier failures.

use super::*;

/// The health check of one target group: `(protocol, port, path, interval, healthy, unhealthy)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TgHealth {
    /// TCP, HTTP or HTTPS.
    pub protocol: String,
    /// `traffic-port` or a number.
    pub port: String,
    /// Path for HTTP(S).
    pub path: Option<String>,
    /// Interval (s).
    pub interval: i32,
    /// Healthy threshold.
    pub healthy: i32,
    /// Unhealthy threshold.
    pub unhealthy: i32,
}

/// AWS-44, in upstream's order (`buildNLBHealthCheckConfiguration`): the defaults (TCP on the
/// traffic port, or HTTP on the health-check NodePort for `externalTrafficPolicy: Local`), then
/// the protocol, path and port annotations, then the Shared health-probe mode
/// (`shared_probe`, only for Services that are not `Local`), which overrides those three, then
/// the interval and threshold annotations.
pub fn health(svc: &Service, opts: &LbOptions, shared_probe: Option<(i32, String)>) -> TgHealth {
    let mut h = match service_health_check_path_port(svc) {
        Some((path, port)) => TgHealth {
            protocol: "HTTP".into(),
            port: port.to_string(),
            path: Some(path.into()),
            interval: 10,
            healthy: 2,
            unhealthy: 2,
        },
        None => TgHealth {
            protocol: "TCP".into(),
            port: "traffic-port".into(),
            path: None,
            interval: 30,
            healthy: 3,
            unhealthy: 3,
        },
    };
    if let Some(p) = &opts.hc_protocol {
        h.protocol = p.clone();
        h.path = match p.as_str() {
            "TCP" => None,
            _ => h.path.or_else(|| Some("/".into())),
        };
    }
    if let Some(p) = &opts.hc_path
        && h.protocol != "TCP"
    {
        h.path = Some(p.clone());
    }
    if let Some(p) = &opts.hc_port {
        h.port = p.clone();
    }
    if let Some((port, path)) = shared_probe {
        h.protocol = "HTTP".into();
        h.port = port.to_string();
        h.path = Some(path);
    }
    if let Some(i) = opts.hc_interval {
        h.interval = i;
    }
    if let Some(v) = opts.hc_healthy {
        h.healthy = v;
    }
    if let Some(v) = opts.hc_unhealthy {
        h.unhealthy = v;
    }
    h
}

/// The health check Go releases up to 1.20 gave an `externalTrafficPolicy: Local` Service's
/// target group (HTTP on the health-check NodePort, every 30 s, thresholds 3/3), where
/// upstream's newest makes 10 s and 2/2 — when `h` is that newer default, no annotation asked
/// for the interval or a threshold, and the Shared health-probe mode is off.
///
/// A target group made that way is adopted as it is (a deliberate difference: upstream
/// recreates it, because AWS cannot change an interval in place, and a new group serves no
/// traffic until its targets pass their first health checks). Its thresholds are not changed
/// either: the Service asked for neither.
pub fn older_release_local_health(svc: &Service, opts: &LbOptions, h: &TgHealth) -> Option<TgHealth> {
    let (path, port) = service_health_check_path_port(svc)?;
    let asked = opts.hc_interval.is_some()
        || opts.hc_healthy.is_some()
        || opts.hc_unhealthy.is_some()
        || opts.hc_protocol.is_some()
        || opts.hc_path.is_some()
        || opts.hc_port.is_some();
    let newest = TgHealth {
        protocol: "HTTP".into(),
        port: port.to_string(),
        path: Some(path.into()),
        interval: 10,
        healthy: 2,
        unhealthy: 2,
    };
    (!asked && *h == newest).then_some(TgHealth {
        interval: 30,
        healthy: 3,
        unhealthy: 3,
        ..newest
    })
}

/// AWS-43, byte for byte upstream's `buildTargetGroupName`: `k8s-<ns ≤8>-<name ≤8>-<first 10
/// hex of SHA-1(cluster ID ‖ namespace ‖ name ‖ port ‖ NodePort ‖ target protocol ‖ "instance" ‖
/// health-check protocol ‖ health-check interval)>` (non-alphanumerics dropped first).
pub fn target_group_name(
    cluster_id: &str,
    svc: &Service,
    port: &LbPort,
    target_protocol: &str,
    h: &TgHealth,
) -> String {
    let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    // The fields one after another with nothing between them, as upstream's
    // buildTargetGroupName writes them into the hasher.
    let mut hasher = sha1::Sha1::new();
    for part in [
        cluster_id,
        ns,
        name,
        &port.port.to_string(),
        &port.node_port.to_string(),
        target_protocol,
        "instance",
        &h.protocol,
        &h.interval.to_string(),
    ] {
        hasher.update(part.as_bytes());
    }
    let digest = hex::encode(hasher.finalize());
    format!("k8s-{}-{}-{}", alnum(ns, 8), alnum(name, 8), &digest[..10])
}

pub(crate) fn tg_protocol(port: &LbPort, opts: &LbOptions) -> (String, String) {
    let tls = port.protocol != "UDP" && opts.is_ssl_port(port.port, port.name.as_deref());
    let listener = if tls {
        "TLS".to_string()
    } else {
        port.protocol.clone()
    };
    let target = if tls && opts.backend_protocol.as_deref() == Some("ssl") {
        "TLS".to_string()
    } else {
        port.protocol.clone()
    };
    (listener, target)
}

/// Whether an existing target group serves a port as upstream's `ensureLoadBalancerv2` keeps
/// it: on the NodePort, with the target protocol, and with the health-check protocol and
/// interval (which AWS cannot change in place) of `h`. Anything else is replaced.
pub(crate) fn target_group_fits(
    tg: &TargetGroup,
    node_port: i32,
    target_protocol: &str,
    h: &TgHealth,
) -> bool {
    tg.port() == Some(node_port)
        && tg.protocol().map(|p| p.as_str()) == Some(target_protocol)
        && tg
            .health_check_protocol()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case(&h.protocol))
        && tg.health_check_interval_seconds() == Some(h.interval)
}

/// Whether `tg` has exactly the health check `h` (protocol, port, path, interval, thresholds).
pub(crate) fn target_group_health_is(tg: &TargetGroup, h: &TgHealth) -> bool {
    tg.health_check_protocol()
        .is_some_and(|p| p.as_str().eq_ignore_ascii_case(&h.protocol))
        && tg.health_check_port() == Some(h.port.as_str())
        && (h.path.is_none() || tg.health_check_path() == h.path.as_deref())
        && tg.health_check_interval_seconds() == Some(h.interval)
        && tg.healthy_threshold_count() == Some(h.healthy)
        && tg.unhealthy_threshold_count() == Some(h.unhealthy)
}

impl AwsCloud {
    /// The target groups of the NLB `arn`. No target group at all is "not found" (moto; a
    /// failed first listener): an empty list.
    pub(crate) async fn nlb_target_groups(&self, name: &str, arn: &str) -> CloudResult<Vec<TargetGroup>> {
        let r = self
            .api
            .call(
                "elbv2_describe_target_groups",
                self.elbv2.describe_target_groups().load_balancer_arn(arn).send(),
            )
            .await;
        Ok(not_found_as_none(r, &["TargetGroupNotFound"])
            .map_err(|e| cloud_error(format!("listing target groups of {name}"), e))?
            .map(|o| o.target_groups().to_vec())
            .unwrap_or_default())
    }

    /// Brings the health check of an existing target group to `h` where it can change in
    /// place (port, thresholds, path); one `ModifyTargetGroup` only when something differs.
    pub(crate) async fn sync_tg_health_check(&self, tg: &TargetGroup, h: &TgHealth) -> CloudResult<()> {
        let differs = tg.health_check_port() != Some(h.port.as_str())
            || tg.healthy_threshold_count() != Some(h.healthy)
            || tg.unhealthy_threshold_count() != Some(h.unhealthy)
            || (h.path.is_some() && tg.health_check_path() != h.path.as_deref());
        if !differs {
            return Ok(());
        }
        let name = tg.target_group_name().unwrap_or_default();
        self.api
            .call(
                "elbv2_modify_target_group",
                self.elbv2
                    .modify_target_group()
                    .target_group_arn(tg.target_group_arn().unwrap_or_default())
                    .health_check_port(&h.port)
                    .healthy_threshold_count(h.healthy)
                    .unhealthy_threshold_count(h.unhealthy)
                    .set_health_check_path(h.path.clone())
                    .send(),
            )
            .await
            .map_err(|e| cloud_error(format!("updating the health check of {name}"), e))?;
        Ok(())
    }

    /// The target group named `tg_name` (AWS-43), made when there is none: `(ARN, created)`.
    pub(crate) async fn ensure_target_group(
        &self,
        tg_name: &str,
        vpc: &str,
        port: &LbPort,
        protocol: &str,
        h: &TgHealth,
        resource_tags: &[(String, String)],
    ) -> CloudResult<(String, bool)> {
        let r = self
            .api
            .call(
                "elbv2_describe_target_groups",
                self.elbv2.describe_target_groups().names(tg_name).send(),
            )
            .await;
        let found = not_found_as_none(r, &["TargetGroupNotFound"])
            .map_err(|e| cloud_error(format!("describing target group {tg_name}"), e))?;
        if let Some(tg) = found.and_then(|o| o.target_groups().first().cloned()) {
            self.sync_tg_health_check(&tg, h).await?;
            return Ok((tg.target_group_arn().unwrap_or_default().to_string(), false));
        }
        let out = self
            .api
            .call(
                "elbv2_create_target_group",
                self.elbv2
                    .create_target_group()
                    .name(tg_name)
                    .protocol(ProtocolEnum::from(protocol))
                    .port(port.node_port)
                    .vpc_id(vpc)
                    .target_type(TargetTypeEnum::Instance)
                    .health_check_protocol(ProtocolEnum::from(h.protocol.as_str()))
                    .health_check_port(&h.port)
                    .set_health_check_path(h.path.clone())
                    .health_check_interval_seconds(h.interval)
                    .healthy_threshold_count(h.healthy)
                    .unhealthy_threshold_count(h.unhealthy)
                    .set_tags(Some(tags(resource_tags)))
                    .send(),
            )
            .await
            .map_err(|e| cloud_error(format!("creating target group {tg_name}"), e))?;
        out.target_groups()
            .first()
            .and_then(|t| t.target_group_arn())
            .map(|arn| (arn.to_string(), true))
            .ok_or_else(|| CloudError::msg(format!("CreateTargetGroup {tg_name} returned nothing")))
    }

    pub(crate) async fn sync_tg_attributes(&self, arn: &str, opts: &LbOptions) -> CloudResult<()> {
        if opts.target_group_attributes.is_empty() {
            return Ok(());
        }
        let current = self
            .api
            .call(
                "elbv2_describe_target_group_attributes",
                self.elbv2
                    .describe_target_group_attributes()
                    .target_group_arn(arn)
                    .send(),
            )
            .await
            .map_err(|e| cloud_error("reading target group attributes", e))?;
        let have: BTreeMap<String, String> = current
            .attributes()
            .iter()
            .filter_map(|a| Some((a.key()?.to_string(), a.value()?.to_string())))
            .collect();
        let changes: Vec<TargetGroupAttribute> = opts
            .target_group_attributes
            .iter()
            .filter(|(k, v)| have.get(*k) != Some(v))
            .map(|(k, v)| TargetGroupAttribute::builder().key(k).value(v).build())
            .collect();
        if !changes.is_empty() {
            self.api
                .call(
                    "elbv2_modify_target_group_attributes",
                    self.elbv2
                        .modify_target_group_attributes()
                        .target_group_arn(arn)
                        .set_attributes(Some(changes))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("setting target group attributes", e))?;
        }
        Ok(())
    }

    /// Targets = every instance on the NodePort; deregister first, then register, 100 at a time.
    pub(crate) async fn sync_targets(
        &self,
        arn: &str,
        node_port: i32,
        instances: &[Arc<InstanceInfo>],
    ) -> CloudResult<()> {
        let health = self
            .api
            .call(
                "elbv2_describe_target_health",
                self.elbv2.describe_target_health().target_group_arn(arn).send(),
            )
            .await
            .map_err(|e| cloud_error("reading target health", e))?;
        let have: BTreeSet<(String, i32)> = health
            .target_health_descriptions()
            .iter()
            .filter(|d| {
                d.target_health()
                    .and_then(|h| h.reason())
                    .is_none_or(|r| r.as_str() != "Target.DeregistrationInProgress")
            })
            .filter_map(|d| {
                d.target()
                    .and_then(|t| Some((t.id()?.to_string(), t.port().unwrap_or(node_port))))
            })
            .collect();
        let want: BTreeSet<(String, i32)> = instances.iter().map(|i| (i.id.clone(), node_port)).collect();
        let target = |(id, port): &(String, i32)| TargetDescription::builder().id(id).port(*port).build();
        let remove: Vec<TargetDescription> = have.difference(&want).map(target).collect();
        let add: Vec<TargetDescription> = want.difference(&have).map(target).collect();
        for chunk in remove.chunks(100) {
            self.api
                .call(
                    "elbv2_deregister_targets",
                    self.elbv2
                        .deregister_targets()
                        .target_group_arn(arn)
                        .set_targets(Some(chunk.to_vec()))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("deregistering targets", e))?;
        }
        for chunk in add.chunks(100) {
            self.api
                .call(
                    "elbv2_register_targets",
                    self.elbv2
                        .register_targets()
                        .target_group_arn(arn)
                        .set_targets(Some(chunk.to_vec()))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("registering targets", e))?;
        }
        Ok(())
    }

    pub(crate) async fn delete_target_group(&self, arn: &str) -> CloudResult<()> {
        let r = self
            .api
            .call(
                "elbv2_delete_target_group",
                self.elbv2.delete_target_group().target_group_arn(arn).send(),
            )
            .await;
        not_found_as_none(r, &["TargetGroupNotFound"])
            .map(|_| ())
            .map_err(|e| cloud_error(format!("deleting target group {arn}"), e))
    }

    /// Deletes the target groups of `svc` that no load balancer uses any more: named
    /// `k8s-<ns ≤8>-<name ≤8>-…` (AWS-43), tagged `kubernetes.io/cluster/<id>=owned` and
    /// `kubernetes.io/service-name=<ns>/<name>` — what a failed listener creation, a replaced
    /// listener or a failed delete (`ResourceInUse`) leaves behind. A group whose only load
    /// balancers are in `gone` (just deleted; the API may still list them for a while) counts
    /// as unused. Returns how many are left (still in use).
    pub(crate) async fn sweep_target_groups(&self, svc: &Service, gone: &[String]) -> CloudResult<usize> {
        let key = service_key(svc);
        let prefix = format!(
            "k8s-{}-{}-",
            alnum(svc.metadata.namespace.as_deref().unwrap_or_default(), 8),
            alnum(svc.metadata.name.as_deref().unwrap_or_default(), 8)
        );
        let mut mine = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let page = self
                .api
                .call(
                    "elbv2_describe_target_groups",
                    self.elbv2
                        .describe_target_groups()
                        .page_size(400)
                        .set_marker(marker.take())
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("listing target groups", e))?;
            mine.extend(
                page.target_groups()
                    .iter()
                    .filter(|t| t.target_group_name().is_some_and(|n| n.starts_with(&prefix)))
                    .cloned(),
            );
            marker = page.next_marker().filter(|m| !m.is_empty()).map(str::to_string);
            if marker.is_none() {
                break;
            }
        }
        // Load balancers these groups name that may be gone already.
        let mut gone: BTreeSet<String> = gone.iter().cloned().collect();
        let named: BTreeSet<String> = mine
            .iter()
            .flat_map(|t| t.load_balancer_arns().iter().cloned())
            .filter(|a| !gone.contains(a))
            .collect();
        for arn in named {
            let r = self
                .api
                .call(
                    "elbv2_describe_load_balancers",
                    self.elbv2
                        .describe_load_balancers()
                        .load_balancer_arns(&arn)
                        .send(),
                )
                .await;
            let found = not_found_as_none(r, &["LoadBalancerNotFound"])
                .map_err(|e| cloud_error("checking the load balancers of target groups", e))?;
            if found.is_none_or(|o| o.load_balancers().is_empty()) {
                gone.insert(arn);
            }
        }
        let unattached: Vec<String> = mine
            .iter()
            .filter(|t| t.load_balancer_arns().iter().all(|a| gone.contains(a)))
            .filter_map(|t| t.target_group_arn().map(str::to_string))
            .collect();
        let mut left = 0;
        for chunk in unattached.chunks(20) {
            let described = self
                .api
                .call(
                    "elbv2_describe_tags",
                    self.elbv2
                        .describe_tags()
                        .set_resource_arns(Some(chunk.to_vec()))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("reading target group tags", e))?;
            for d in described.tag_descriptions() {
                let tags = crate::lb::network::elbv2_tag_map(d.tags());
                if !self.owned_by_cluster(&tags) || tags.get("kubernetes.io/service-name") != Some(&key) {
                    continue;
                }
                let arn = d.resource_arn().unwrap_or_default();
                match self.delete_target_group(arn).await {
                    Ok(()) => {
                        tracing::info!(service = %key, target_group = arn, "deleted an unused target group")
                    }
                    Err(e) => {
                        tracing::info!(service = %key, target_group = arn, error = %e, "unused target group not deletable yet");
                        left += 1;
                    }
                }
            }
        }
        Ok(left)
    }
}
