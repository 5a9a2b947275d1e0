//! The `[LoadBalancer]` defaults OCCM users rely on: `internal-lb` enforced, the subnet and
//! floating network detected when the config leaves them unset, and Octavia's features asked
//! for only where its API version has them.

use anyhow::{Context, Result};
use kube::api::PostParams;
use rcp_e2e::{
    fault_proxy::{Action, Rule},
    k8s::{load_balancer_service, wait_for_event},
};

use crate::openstack_lb::env::*;

/// With `internal-lb = true` a Service annotated `openstack-internal-load-balancer: "false"`
/// stays internal (as OCCM: the cloud's admin keeps every load balancer in): its address is
/// the VIP on the private subnet and the project has no floating IP, though the config names
/// a floating network. Internal Services as OCCM makes them: `spec.loadBalancerIP` is the VIP;
/// with `allocateLoadBalancerNodePorts: false` the listener and pool have no member.
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

    // spec.loadBalancerIP of an internal Service: the VIP.
    env.service("pinned", Some("10.2.0.77")).await?;
    assert_eq!(env.ingress("pinned").await?, "10.2.0.77");
    assert_eq!(env.load_balancer("pinned").await?["vip_address"], "10.2.0.77");
    env.delete_service("pinned").await?;

    // allocateLoadBalancerNodePorts: false: a listener and a pool without members.
    let mut direct = load_balancer_service("direct", &[], &[(80, "http")]);
    direct
        .spec
        .as_mut()
        .context("spec")?
        .allocate_load_balancer_node_ports = Some(false);
    env.services.create(&PostParams::default(), &direct).await?;
    env.ingress("direct").await?;
    let lb = env.load_balancer("direct").await?;
    let objects = env.octavia_objects(lb["id"].as_str().context("id")?).await?;
    assert_eq!(objects.listeners.len(), 1, "{:?}", objects.listeners);
    assert_eq!(objects.listeners[0]["protocol_port"], 80);
    assert_eq!(objects.pools.len(), 1, "{:?}", objects.pools);
    assert!(objects.members.is_empty(), "{:?}", objects.members);
    env.delete_service("direct").await?;
    Ok(())
}

/// With neither `subnet-id` nor `floating-network-id` in the config (OCCM detects both): the
/// VIP and the members go on the subnet of the Node's address (read from its server's neutron
/// port), and the floating IP comes from the external network of the VIP subnet's router
/// (other projects' external networks, which the project also sees, are not taken). The Node
/// has only an ExternalIP here (`[Networking] public-network-name` names its network): as
/// OCCM, its member takes it. An internal Service beside it gets no floating IP.
#[tokio::test]
async fn an_unset_subnet_and_floating_network_are_detected() -> Result<()> {
    let env = env_full(
        "lb-detect",
        Setup {
            detect_networks: true,
            load_balancer_lines: "[Networking]\npublic-network-name = private\n",
            ..Default::default()
        },
    )
    .await?;
    let node: k8s_openapi::api::core::v1::Node = kube::Api::all(env.client.clone()).get("node-0").await?;
    let addresses: Vec<(String, String)> = node
        .status
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.type_ != "Hostname")
        .map(|a| (a.type_, a.address))
        .collect();
    assert_eq!(addresses.len(), 1, "{addresses:?}");
    assert_eq!(addresses[0].0, "ExternalIP", "{addresses:?}");
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
    assert_eq!(
        objects.members[0]["address"],
        addresses[0].1.as_str(),
        "the ExternalIP"
    );
    assert_eq!(objects.members[0]["subnet_id"], env.private.subnet_id.as_str());

    let inside_address = env.ingress("inside").await?;
    assert!(inside_address.starts_with("10.2.0."), "{inside_address}");
    assert_eq!(env.project.floating_ips().await?.len(), 1);

    env.delete_service("auto").await?;
    env.delete_service("inside").await?;
    assert!(env.project.floating_ips().await?.is_empty());
    Ok(())
}

/// Octavia's version document capped at API 2.5 (before flavors, 2.6, and availability zones,
/// 2.14): an older Octavia, in front of the real one.
fn octavia_2_5(body: &str) -> String {
    let Ok(mut doc) = serde_json::from_str::<serde_json::Value>(body) else {
        return body.to_string();
    };
    let Some(versions) = doc.get_mut("versions").and_then(|v| v.as_array_mut()) else {
        return body.to_string();
    };
    versions.retain(|v| {
        let id = v["id"].as_str().unwrap_or_default();
        let minor = id.strip_prefix("v2.").and_then(|m| m.parse::<u32>().ok());
        minor.is_some_and(|m| m <= 5)
    });
    doc.to_string()
}

/// As OCCM, `flavor-id` and `availability-zone` reach Octavia only where its API has them
/// (2.6, 2.14; never with the `ovn` provider): on an Octavia that reports 2.5 they are left out
/// (with a warning) and the load balancer is made; sent, the real Octavia would refuse a flavor
/// and a zone it does not have.
#[tokio::test]
async fn flavor_and_availability_zone_are_sent_only_where_octavia_has_them() -> Result<()> {
    let env = env("lb-gates").await?;
    env.project
        .octavia_proxy
        .add(Rule::new(&[""], Action::Rewrite(octavia_2_5)));
    let mut svc = load_balancer_service("gated", &[], &[(80, "http")]);
    svc.metadata.annotations = Some(
        [
            (
                "loadbalancer.openstack.org/flavor-id".to_string(),
                "00000000-0000-4000-8000-00000000f1a0".to_string(),
            ),
            (
                "loadbalancer.openstack.org/availability-zone".to_string(),
                "no-such-zone".to_string(),
            ),
        ]
        .into(),
    );
    env.services.create(&PostParams::default(), &svc).await?;
    env.ingress("gated").await?;
    let lb = env.load_balancer("gated").await?;
    assert!(lb["flavor_id"].is_null(), "no flavor sent: {lb}");
    assert!(lb["availability_zone"].is_null(), "no zone sent: {lb}");
    let log = env.ccm.log();
    assert!(
        log.contains("left out of the new load balancer") && log.contains("flavor_id"),
        "the CCM says what it left out:\n{log}"
    );
    env.delete_service("gated").await?;
    Ok(())
}

/// With `floating-network-id` unset and no external network to detect (neutron answers none),
/// an external Service shows its VIP and gets OCCM's Warning
/// `LoadBalancerExternalNetworkSearchFailed`, recorded as OCCM's component
/// (`cloud-provider-openstack`) through the framework's provider Event recorder.
#[tokio::test]
async fn no_external_network_to_detect_is_a_warning_on_the_service() -> Result<()> {
    let env = env_full(
        "lb-no-external",
        Setup {
            detect_networks: true,
            ..Default::default()
        },
    )
    .await?;
    env.project.neutron_proxy.add(Rule::new(
        &["router:external"],
        Action::Respond {
            status: 200,
            body: r#"{"networks": []}"#.into(),
        },
    ));
    env.service("bare", None).await?;
    let address = env.ingress("bare").await?;
    assert!(address.starts_with("10.2.0."), "{address}: the VIP");
    let events = wait_for_event(&env.client, "default", "bare", T, |reason, message| {
        reason == "LoadBalancerExternalNetworkSearchFailed" && message.contains("floating-network-id")
    })
    .await?;
    assert!(
        events.iter().any(
            |(reason, _, component)| reason == "LoadBalancerExternalNetworkSearchFailed"
                && component == "cloud-provider-openstack"
        ),
        "{events:?}"
    );
    assert!(env.project.floating_ips().await?.is_empty(), "no floating IP");
    Ok(())
}

/// Where Octavia has them (the test cloud's Zed Octavia), `flavor-id` and `availability-zone` reach the
/// new load balancer: an Octavia flavor and availability zone the cloud's admin defined
/// (amphora provider profiles) are read back from it.
#[tokio::test]
async fn flavor_and_availability_zone_reach_octavia_where_it_has_them() -> Result<()> {
    use rcp_e2e::openstack::OCTAVIA;
    let env = env("lb-flavor").await?;
    let admin = &env.project.admin;
    let suffix = &env.project.name;
    let profile = admin
        .post(
            &format!("{OCTAVIA}/lbaas/flavorprofiles"),
            serde_json::json!({"flavorprofile": {"name": format!("fp-{suffix}"), "provider_name": "amphora",
                   "flavor_data": "{\"loadbalancer_topology\": \"SINGLE\"}"}}),
        )
        .await?;
    let flavor = admin
        .post(
            &format!("{OCTAVIA}/lbaas/flavors"),
            serde_json::json!({"flavor": {"name": format!("f-{suffix}"), "enabled": true,
                   "flavor_profile_id": profile["flavorprofile"]["id"]}}),
        )
        .await?["flavor"]["id"]
        .as_str()
        .context("flavor id")?
        .to_string();
    let zone_profile = admin
        .post(
            &format!("{OCTAVIA}/lbaas/availabilityzoneprofiles"),
            serde_json::json!({"availability_zone_profile": {"name": format!("azp-{suffix}"), "provider_name": "amphora",
                   "availability_zone_data": "{\"compute_zone\": \"nova\"}"}}),
        )
        .await?;
    let zone = format!("az-{suffix}");
    admin
        .post(
            &format!("{OCTAVIA}/lbaas/availabilityzones"),
            serde_json::json!({"availability_zone": {"name": zone, "enabled": true,
                   "availability_zone_profile_id": zone_profile["availability_zone_profile"]["id"]}}),
        )
        .await?;
    let mut svc = load_balancer_service("flavoured", &[], &[(80, "http")]);
    svc.metadata.annotations = Some(
        [
            ("loadbalancer.openstack.org/flavor-id".to_string(), flavor.clone()),
            (
                "loadbalancer.openstack.org/availability-zone".to_string(),
                zone.clone(),
            ),
        ]
        .into(),
    );
    env.services.create(&PostParams::default(), &svc).await?;
    env.ingress("flavoured").await?;
    let lb = env.load_balancer("flavoured").await?;
    assert_eq!(lb["flavor_id"], flavor.as_str(), "{lb}");
    assert_eq!(lb["availability_zone"], zone.as_str(), "{lb}");
    env.delete_service("flavoured").await?;
    Ok(())
}
