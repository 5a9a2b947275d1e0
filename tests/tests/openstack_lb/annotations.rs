//! OCCM's annotations, read back from Octavia.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use rcp_e2e::{
    k8s::{initialised, load_balancer_service, tainted_node, wait_for, wait_for_event},
    openstack::NEUTRON,
};
use serde_json::json;

use crate::openstack_lb::env::*;

/// OCCM's listener, pool, monitor and status annotations, read back from Octavia: connection
/// limit and timeouts on the listener, PROXY protocol on the pool, the monitor's settings, the
/// status's hostname; changed on the Service, each is changed in Octavia (the pool made again
/// for a new protocol, the monitor updated in place). With `enable-ingress-hostname`, a PROXY
/// protocol Service without the hostname annotation shows `<address>.<suffix>`, and its address
/// once PROXY protocol is off. `sessionAffinity: ClientIP` gives the pools `SOURCE_IP`
/// persistence (OCCM), kept by a pool made again, removed in place for `None`.
#[tokio::test]
async fn annotations_reach_octavia_and_follow_changes() -> Result<()> {
    let env = env_full(
        "lb-annotations",
        Setup {
            load_balancer_lines: "enable-ingress-hostname = true\ningress-hostname-suffix = nip.test\n",
            ..Default::default()
        },
    )
    .await?;
    let a = |pairs: &[(&str, &str)]| -> serde_json::Value {
        json!({"metadata": {"annotations": pairs
            .iter()
            .map(|(k, v)| (format!("loadbalancer.openstack.org/{k}"), serde_json::Value::String(v.to_string())))
            .collect::<serde_json::Map<_, _>>()}})
    };
    let mut svc = load_balancer_service("tuned", &[], &[(80, "http")]);
    svc.metadata.annotations = serde_json::from_value(
        a(&[
            ("connection-limit", "100"),
            ("timeout-client-data", "60000"),
            ("timeout-member-connect", "4000"),
            ("timeout-member-data", "40000"),
            ("timeout-tcp-inspect", "1000"),
            ("proxy-protocol", "v2"),
            ("enable-health-monitor", "true"),
            ("health-monitor-delay", "10"),
            ("health-monitor-timeout", "5"),
            ("health-monitor-max-retries", "2"),
            ("health-monitor-max-retries-down", "4"),
            ("hostname", "tuned.example.test"),
        ])["metadata"]["annotations"]
            .clone(),
    )?;
    svc.spec.as_mut().context("spec")?.session_affinity = Some("ClientIP".into());
    env.services.create(&PostParams::default(), &svc).await?;
    let hostname = wait_for("tuned's hostname", T, || async {
        let s = env.services.get("tuned").await.ok()?;
        s.status?.load_balancer?.ingress?.first()?.hostname.clone()
    })
    .await
    .inspect_err(|_| eprintln!("{}", env.ccm.log()))?;
    assert_eq!(hostname, "tuned.example.test");
    let lb = env.load_balancer("tuned").await?;
    let lb_id = lb["id"].as_str().context("id")?.to_string();
    let read = || async {
        let o = env.octavia_objects(&lb_id).await?;
        anyhow::Ok((o.listeners, o.pools, o.monitors))
    };
    let (listeners, pools, monitors) = read().await?;
    assert_eq!(listeners.len(), 1, "{listeners:?}");
    assert_eq!(listeners[0]["connection_limit"], 100);
    assert_eq!(listeners[0]["timeout_client_data"], 60000);
    assert_eq!(listeners[0]["timeout_member_connect"], 4000);
    assert_eq!(listeners[0]["timeout_member_data"], 40000);
    assert_eq!(listeners[0]["timeout_tcp_inspect"], 1000);
    assert_eq!(pools.len(), 1, "{pools:?}");
    assert_eq!(pools[0]["protocol"], "PROXYV2");
    assert_eq!(
        pools[0]["session_persistence"]["type"], "SOURCE_IP",
        "sessionAffinity: ClientIP"
    );
    assert_eq!(monitors.len(), 1, "{monitors:?}");
    assert_eq!(monitors[0]["delay"], 10);
    assert_eq!(monitors[0]["timeout"], 5);
    assert_eq!(monitors[0]["max_retries"], 2);
    assert_eq!(monitors[0]["max_retries_down"], 4);
    let first_pool = pools[0]["id"].clone();

    // Without the hostname annotation: `<address>.<suffix>` (PROXY protocol is on).
    env.services
        .patch(
            "tuned",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"loadbalancer.openstack.org/hostname": null}}}),
            ),
        )
        .await?;
    let fips = env.project.floating_ips().await?;
    let fip = fips
        .iter()
        .find(|f| {
            f["description"]
                .as_str()
                .unwrap_or_default()
                .contains("default/tuned")
        })
        .and_then(|f| f["floating_ip_address"].as_str())
        .context("tuned's floating IP")?
        .to_string();
    wait_for("tuned's <address>.nip.test", T, || async {
        let s = env.services.get("tuned").await.ok()?;
        (s.status?.load_balancer?.ingress?.first()?.hostname.as_deref()? == format!("{fip}.nip.test"))
            .then_some(())
    })
    .await
    .inspect_err(|_| eprintln!("{}", env.ccm.log()))?;

    // Changed: no PROXY protocol (a new pool), another delay, no connection limit.
    env.services
        .patch(
            "tuned",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "loadbalancer.openstack.org/proxy-protocol": null,
                "loadbalancer.openstack.org/health-monitor-delay": "20",
                "loadbalancer.openstack.org/connection-limit": "-1",
            }}})),
        )
        .await?;
    let (listeners, pools, monitors) = wait_for("the changes in Octavia", T, || async {
        let (l, p, m) = read().await.ok()?;
        (p.len() == 1
            && p[0]["protocol"] == "TCP"
            && m.len() == 1
            && m[0]["delay"] == 20
            && l[0]["connection_limit"] == -1)
            .then_some((l, p, m))
    })
    .await
    .inspect_err(|_| eprintln!("{}", env.ccm.log()))?;
    assert_ne!(
        pools[0]["id"], first_pool,
        "a pool cannot change its protocol: made again"
    );
    assert_eq!(monitors[0]["max_retries"], 2, "the rest kept");
    assert_eq!(listeners[0]["timeout_client_data"], 60000);
    let members = env
        .project
        .octavia_list(
            &format!("pools/{}/members", pools[0]["id"].as_str().unwrap_or_default()),
            "members",
        )
        .await?;
    assert_eq!(members.len(), 1, "the new pool has the member: {members:?}");
    assert_eq!(
        env.ingress("tuned").await?,
        fip,
        "PROXY protocol off: the address"
    );
    assert_eq!(pools[0]["session_persistence"]["type"], "SOURCE_IP");

    // sessionAffinity: None: the same pool loses its session persistence.
    env.services
        .patch(
            "tuned",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"sessionAffinity": "None"}})),
        )
        .await?;
    let same_pool = pools[0]["id"].clone();
    wait_for("no session persistence", T, || async {
        let (_, p, _) = read().await.ok()?;
        (p.len() == 1 && p[0]["id"] == same_pool && p[0]["session_persistence"].is_null()).then_some(())
    })
    .await
    .inspect_err(|_| eprintln!("{}", env.ccm.log()))?;
    env.delete_service("tuned").await?;
    Ok(())
}

/// Members by `node-selector`, an HTTP listener and pool with `X-Forwarded-For`
/// (`x-forwarded-for`), and for `externalTrafficPolicy: Local` an HTTP health monitor on the
/// Service's `healthCheckNodePort` (`GET /healthz`, each member's monitor port), read back
/// from Octavia; changed back, each follows (a TCP listener again, both Nodes, a TCP monitor).
#[tokio::test]
async fn node_selector_x_forwarded_for_and_local_traffic_monitors_reach_octavia() -> Result<()> {
    let env = env("lb-select").await?;
    env.project.server("node-1", &env.private).await?;
    let nodes: Api<Node> = Api::all(env.client.clone());
    nodes
        .create(&PostParams::default(), &tainted_node("node-1"))
        .await?;
    wait_for("node-1 initialised", T, || initialised(&nodes, "node-1")).await?;
    nodes
        .patch(
            "node-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"lb": "yes"}}})),
        )
        .await?;
    let mut svc = load_balancer_service("web", &[], &[(80, "http")]);
    svc.metadata.annotations = Some(
        [
            ("node-selector", "lb=yes"),
            ("x-forwarded-for", "true"),
            ("enable-health-monitor", "true"),
        ]
        .iter()
        .map(|(k, v)| (format!("loadbalancer.openstack.org/{k}"), v.to_string()))
        .collect(),
    );
    svc.spec.as_mut().context("spec")?.external_traffic_policy = Some("Local".into());
    env.services.create(&PostParams::default(), &svc).await?;
    env.ingress("web").await?;
    let health_port = env
        .services
        .get("web")
        .await?
        .spec
        .context("spec")?
        .health_check_node_port
        .context("healthCheckNodePort")?;
    let lb_id = env.load_balancer("web").await?["id"]
        .as_str()
        .context("id")?
        .to_string();
    let read = || async {
        let o = env.octavia_objects(&lb_id).await?;
        anyhow::Ok((o.listeners, o.pools, o.members, o.monitors))
    };
    let (listeners, pools, members, monitors) = read().await?;
    assert_eq!(listeners.len(), 1, "{listeners:?}");
    assert_eq!(listeners[0]["protocol"], "HTTP");
    assert_eq!(listeners[0]["insert_headers"]["X-Forwarded-For"], "true");
    assert_eq!(pools[0]["protocol"], "HTTP");
    assert_eq!(members.len(), 1, "only node-0 has lb=yes: {members:?}");
    assert_eq!(members[0]["name"], "node-0");
    assert_eq!(members[0]["monitor_port"], health_port);
    assert_eq!(monitors.len(), 1, "{monitors:?}");
    assert_eq!(monitors[0]["type"], "HTTP");
    assert_eq!(monitors[0]["url_path"], "/healthz");

    env.services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {
                    "loadbalancer.openstack.org/node-selector": null,
                    "loadbalancer.openstack.org/x-forwarded-for": null,
                }},
                "spec": {"externalTrafficPolicy": "Cluster"},
            })),
        )
        .await?;
    let (listeners, pools, members, monitors) = wait_for("the changes in Octavia", T, || async {
        let (l, p, m, h) = read().await.ok()?;
        (l.len() == 1 && l[0]["protocol"] == "TCP" && m.len() == 2 && h.len() == 1 && h[0]["type"] == "TCP")
            .then_some((l, p, m, h))
    })
    .await
    .inspect_err(|_| eprintln!("{}", env.ccm.log()))?;
    assert_eq!(listeners[0]["protocol_port"], 80);
    assert_eq!(pools.len(), 1, "the HTTP pool went with its listener: {pools:?}");
    assert_eq!(pools[0]["protocol"], "TCP");
    assert!(
        members.iter().all(|m| m["monitor_port"].is_null()),
        "no monitor port without the HTTP monitor: {members:?}"
    );
    assert_eq!(monitors[0]["pools"][0]["id"], pools[0]["id"], "{monitors:?}");
    env.delete_service("web").await?;
    Ok(())
}

/// `loadbalancer.openstack.org/class` picks a `[LoadBalancerClass "…"]` of the config: its
/// floating subnet (a second subnet of the external network) gives the Service its address; a
/// class the config lacks is a Warning naming the classes it has. The floating subnet is also
/// chosen by a name glob (`floating-subnet`), by a tag (`floating-subnet-tags`) and by ID
/// (`floating-subnet-id`).
#[tokio::test]
async fn load_balancer_classes_and_floating_subnet_patterns_choose_the_floating_subnet() -> Result<()> {
    let env = env_full(
        "lb-class",
        Setup {
            load_balancer_lines: "[LoadBalancerClass \"second\"]\nfloating-subnet-id = ${SECOND_FLOATING_SUBNET}\n",
            ..Default::default()
        },
    )
    .await?;
    let class = |name: &str| {
        let mut svc = load_balancer_service(name, &[], &[(80, "http")]);
        svc.metadata.annotations = Some(
            [("loadbalancer.openstack.org/class".to_string(), name.to_string())]
                .into_iter()
                .collect(),
        );
        svc
    };
    env.services
        .create(&PostParams::default(), &class("second"))
        .await?;
    let address = env.ingress("second").await?;
    assert!(
        address.starts_with("172.24.9."),
        "{address}: not from the class's floating subnet 172.24.9.0/24"
    );
    env.services
        .create(&PostParams::default(), &class("missing"))
        .await?;
    wait_for_event(&env.client, "default", "missing", T, |reason, message| {
        reason == "SyncLoadBalancerFailed"
            && message.contains("\"missing\" is no [LoadBalancerClass]")
            && message.contains("second")
    })
    .await?;
    // By name and by tag (only the second subnet tagged; without a choice neutron takes
    // either).
    let annotated = |name: &str, key: &str, value: &str| {
        let mut svc = load_balancer_service(name, &[], &[(80, "http")]);
        svc.metadata.annotations = Some(
            [(format!("loadbalancer.openstack.org/{key}"), value.to_string())]
                .into_iter()
                .collect(),
        );
        svc
    };
    env.project
        .admin
        .call(
            reqwest::Method::PUT,
            &format!(
                "{NEUTRON}/subnets/{}/tags/lb-pool",
                env.public_second_subnet.as_deref().context("second subnet")?
            ),
            None,
        )
        .await?;
    env.services
        .create(
            &PostParams::default(),
            &annotated("by-name", "floating-subnet", "public-sec*"),
        )
        .await?;
    env.services
        .create(
            &PostParams::default(),
            &annotated("by-tag", "floating-subnet-tags", "lb-pool"),
        )
        .await?;
    let by_name = env.ingress("by-name").await?;
    assert!(
        by_name.starts_with("172.24.9."),
        "public-second by its name: {by_name}"
    );
    let by_tag = env.ingress("by-tag").await?;
    assert!(by_tag.starts_with("172.24.9."), "the tagged subnet: {by_tag}");
    let second = env.public_second_subnet.clone().context("second subnet")?;
    env.services
        .create(
            &PostParams::default(),
            &annotated("by-id", "floating-subnet-id", &second),
        )
        .await?;
    let by_id = env.ingress("by-id").await?;
    assert!(by_id.starts_with("172.24.9."), "the subnet by its ID: {by_id}");
    env.service("plain", None).await?;
    let plain = env.ingress("plain").await?;
    // Neutron picks a subnet of the external network by itself: either one.
    assert!(
        plain.starts_with("172.24.4.") || plain.starts_with("172.24.9."),
        "without a choice, an address of the external network: {plain}"
    );
    for s in ["second", "by-name", "by-tag", "by-id", "plain"] {
        env.delete_service(s).await?;
    }
    Ok(())
}
