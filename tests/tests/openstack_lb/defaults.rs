//! The `[LoadBalancer]` defaults OCCM users rely on: `internal-lb` enforced, and the subnet
//! and floating network detected when the config leaves them unset.

use anyhow::{Context, Result};
use kube::api::PostParams;
use rcp_e2e::k8s::load_balancer_service;

use crate::env::*;

/// With `internal-lb = true` a Service annotated `openstack-internal-load-balancer: "false"`
/// stays internal (as OCCM: the cloud's admin keeps every load balancer in): its address is
/// the VIP on the private subnet and the project has no floating IP, though the config names
/// a floating network.
#[tokio::test]
async fn internal_lb_in_the_config_keeps_a_service_asking_to_be_external_internal() -> Result<()> {
    let env = env_full(
        "lb-internal",
        Setup {
            load_balancer_lines: "internal-lb = true\n",
            ..Default::default()
        },
    )
    .await?;
    let mut svc = load_balancer_service("outside", &[], &[(80, "http")]);
    svc.metadata.annotations = Some(
        [(
            "service.beta.kubernetes.io/openstack-internal-load-balancer".to_string(),
            "false".to_string(),
        )]
        .into(),
    );
    env.services.create(&PostParams::default(), &svc).await?;
    let address = env.ingress("outside").await?;
    let lb = env.load_balancer("outside").await?;
    assert_eq!(lb["vip_address"], address.as_str(), "the VIP is the address");
    assert!(address.starts_with("10.2.0."), "{address}");
    // Synced again: still no floating IP.
    env.sync_again("outside").await?;
    let fips = env.project.floating_ips().await?;
    assert!(fips.is_empty(), "no floating IP: {fips:?}");
    env.delete_service("outside").await?;
    Ok(())
}

/// With neither `subnet-id` nor `floating-network-id` in the config (OCCM detects both): the
/// VIP and the members go on the subnet of the Node's address (read from its server's neutron
/// port), and the floating IP comes from the external network of the VIP subnet's router
/// (other projects' external networks, which the project also sees, are not taken). An
/// internal Service beside it gets no floating IP.
#[tokio::test]
async fn an_unset_subnet_and_floating_network_are_detected() -> Result<()> {
    let env = env_full(
        "lb-detect",
        Setup {
            detect_networks: true,
            ..Default::default()
        },
    )
    .await?;
    env.service("auto", None).await?;
    let mut inside = load_balancer_service("inside", &[], &[(80, "http")]);
    inside.metadata.annotations = Some(
        [(
            "service.beta.kubernetes.io/openstack-internal-load-balancer".to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    env.services.create(&PostParams::default(), &inside).await?;

    let address = env.ingress("auto").await?;
    assert!(address.starts_with("172.24.4."), "a floating IP: {address}");
    let lb = env.load_balancer("auto").await?;
    assert_eq!(lb["vip_subnet_id"], env.private.subnet_id.as_str());
    let fips = env.project.floating_ips().await?;
    assert_eq!(fips.len(), 1, "{fips:?}");
    assert_eq!(fips[0]["floating_ip_address"], address.as_str());
    assert_eq!(fips[0]["floating_network_id"], env.public.id.as_str());
    assert_eq!(fips[0]["port_id"], lb["vip_port_id"]);
    let objects = env.octavia_objects(lb["id"].as_str().context("id")?).await?;
    assert_eq!(objects.members.len(), 1, "{:?}", objects.members);
    assert_eq!(objects.members[0]["subnet_id"], env.private.subnet_id.as_str());

    let inside_address = env.ingress("inside").await?;
    assert!(inside_address.starts_with("10.2.0."), "{inside_address}");
    assert_eq!(env.project.floating_ips().await?.len(), 1);

    env.delete_service("auto").await?;
    env.delete_service("inside").await?;
    assert!(env.project.floating_ips().await?.is_empty());
    Ok(())
}
