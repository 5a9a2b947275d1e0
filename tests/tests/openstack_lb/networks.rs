//! Where a load balancer goes and what stays after it, read back from Octavia and neutron:
//! `network-id` or `subnet-id` with `member-subnet-id`, `port-id`, `loadBalancerSourceRanges`,
//! `keep-floatingip`, `lb-method` (config and annotation) and `cascade-delete = false`.

use anyhow::{Context, Result};
use kube::api::PostParams;
use rcp_e2e::k8s::load_balancer_service;
use serde_json::json;

use crate::openstack_lb::env::*;

fn annotated(name: &str, annotations: &[(&str, &str)]) -> k8s_openapi::api::core::v1::Service {
    let mut svc = load_balancer_service(name, &[], &[(80, "http")]);
    svc.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    svc
}

/// An internal Service whose VIP is on a network of its own (`network-id`) while its members
/// stay on the Nodes' subnet (`member-subnet-id`); an external one on a port the user made
/// (`port-id`) with `loadBalancerSourceRanges` (the listener's allowed CIDRs) and
/// `keep-floatingip` (its floating IP stays, detached, when the Service goes); both with the
/// config's `lb-method` and monitor settings on their pools; a third on a VIP subnet by annotation (`subnet-id`)
/// with its own `lb-method`; with `cascade-delete = false` each load balancer is deleted
/// listener and pool first, not in one cascading call.
#[tokio::test]
async fn vip_network_port_member_subnet_source_ranges_and_what_stays_reach_openstack() -> Result<()> {
    let env = env_full(
        "lb-networks",
        Setup {
            load_balancer_lines: "cascade-delete = false\nlb-method = LEAST_CONNECTIONS\ncreate-monitor = true\nmonitor-delay = 9s\nmonitor-timeout = 4s\nmonitor-max-retries = 3\nmonitor-max-retries-down = 5\n",
            // No subnet-id in the config: the annotations choose.
            detect_networks: true,
            ..Default::default()
        },
    )
    .await?;
    let vip = env.project.network("vip", "10.8.0.0/24").await?;
    let split = annotated(
        "split",
        &[
            ("loadbalancer.openstack.org/network-id", &vip.id),
            (
                "loadbalancer.openstack.org/member-subnet-id",
                &env.private.subnet_id,
            ),
            (
                "service.beta.kubernetes.io/openstack-internal-load-balancer",
                "true",
            ),
        ],
    );
    env.services.create(&PostParams::default(), &split).await?;
    let address = env.ingress("split").await?;
    assert!(
        address.starts_with("10.8.0."),
        "{address}: the VIP on the VIP network"
    );
    let lb = env.load_balancer("split").await?;
    assert_eq!(lb["vip_network_id"], vip.id.as_str());
    assert_eq!(lb["vip_subnet_id"], vip.subnet_id.as_str());
    let o = env.octavia_objects(lb["id"].as_str().context("id")?).await?;
    assert_eq!(o.members.len(), 1, "{:?}", o.members);
    assert_eq!(
        o.members[0]["subnet_id"],
        env.private.subnet_id.as_str(),
        "members on the Nodes' subnet"
    );
    assert_eq!(o.pools[0]["lb_algorithm"], "LEAST_CONNECTIONS");
    // The config's monitor settings.
    let monitor = o
        .monitors
        .iter()
        .find(|m| m["pools"][0]["id"] == o.pools[0]["id"])
        .context("the pool's monitor")?;
    assert_eq!(
        (
            &monitor["delay"],
            &monitor["timeout"],
            &monitor["max_retries"],
            &monitor["max_retries_down"]
        ),
        (&json!(9), &json!(4), &json!(3), &json!(5))
    );

    // The VIP subnet by annotation, and the pools' algorithm over the config's.
    let by_subnet = annotated(
        "by-subnet",
        &[
            ("loadbalancer.openstack.org/subnet-id", &vip.subnet_id),
            (
                "loadbalancer.openstack.org/member-subnet-id",
                &env.private.subnet_id,
            ),
            ("loadbalancer.openstack.org/lb-method", "SOURCE_IP"),
            (
                "service.beta.kubernetes.io/openstack-internal-load-balancer",
                "true",
            ),
        ],
    );
    env.services.create(&PostParams::default(), &by_subnet).await?;
    env.ingress("by-subnet").await?;
    let lb = env.load_balancer("by-subnet").await?;
    assert_eq!(lb["vip_subnet_id"], vip.subnet_id.as_str());
    let o = env.octavia_objects(lb["id"].as_str().context("id")?).await?;
    assert_eq!(o.pools[0]["lb_algorithm"], "SOURCE_IP");

    let port = env.project.port("users-vip", &env.private).await?;
    let mut kept = annotated(
        "kept",
        &[
            ("loadbalancer.openstack.org/port-id", &port),
            ("loadbalancer.openstack.org/keep-floatingip", "true"),
        ],
    );
    kept.spec.as_mut().context("spec")?.load_balancer_source_ranges =
        Some(vec!["192.168.0.0/16".into(), "10.0.0.0/8".into()]);
    env.services.create(&PostParams::default(), &kept).await?;
    let floating = env.ingress("kept").await?;
    assert!(floating.starts_with("172.24.4."), "{floating}: a floating IP");
    let lb = env.load_balancer("kept").await?;
    assert_eq!(lb["vip_port_id"], port.as_str(), "the user's port is the VIP");
    let o = env.octavia_objects(lb["id"].as_str().context("id")?).await?;
    let mut cidrs: Vec<&str> = o.listeners[0]["allowed_cidrs"]
        .as_array()
        .context("allowed_cidrs")?
        .iter()
        .filter_map(|c| c.as_str())
        .collect();
    cidrs.sort();
    assert_eq!(cidrs, ["10.0.0.0/8", "192.168.0.0/16"]);

    env.project.octavia_proxy.reset_counts();
    env.delete_service("kept").await?;
    let seen = env.project.octavia_proxy.counts_by_method();
    for part in ["DELETE /v2/lbaas/listeners/", "DELETE /v2/lbaas/pools/"] {
        assert!(
            seen.keys().any(|k| k.starts_with(part)),
            "cascade-delete = false: {part}… before the load balancer: {seen:?}"
        );
    }
    let fip = env
        .project
        .floating_ips()
        .await?
        .into_iter()
        .find(|f| f["floating_ip_address"] == floating.as_str())
        .context("keep-floatingip: the floating IP stays")?;
    assert!(fip["port_id"].is_null(), "detached: {fip}");
    env.delete_service("split").await?;
    env.delete_service("by-subnet").await?;
    Ok(())
}
