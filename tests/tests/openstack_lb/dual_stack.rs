//! Members of the Service's IP family on a dual-stack cluster.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::PostParams};
use rcp_e2e::k8s::{load_balancer_service, wait_for};

use crate::openstack_lb::env::*;

/// On a dual-stack cluster whose Node has an InternalIP of each family (nova's server on a
/// network with an IPv4 and an IPv6 subnet), with a config that names no subnet and no
/// floating network (as OCCM's docs advise for dual-stack): an IPv6 Service without any
/// annotation gets its VIP and members on the IPv6 subnet (detected from the Node's port, by
/// the Service's family), its address is the IPv6 VIP (neutron has no IPv6 floating IPs: none
/// is made, as OCCM); an IPv4 Service beside it gets IPv4 members on the IPv4 subnet and a
/// floating IP from the detected external network.
#[tokio::test]
async fn members_follow_the_services_ip_family() -> Result<()> {
    let env = env_full(
        "lb-dual",
        Setup {
            dual_stack: true,
            detect_networks: true,
            ..Default::default()
        },
    )
    .await?;
    let v6_subnet = env.private_v6_subnet.clone().context("IPv6 subnet")?;
    let nodes: Api<Node> = Api::all(env.client.clone());
    let internal = |family_v6: bool| {
        let nodes = nodes.clone();
        async move {
            let node = nodes.get("node-0").await.ok()?;
            node.status?
                .addresses?
                .into_iter()
                .find(|a| a.type_ == "InternalIP" && a.address.contains(':') == family_v6)
                .map(|a| a.address)
        }
    };
    let v6 = wait_for("node-0's IPv6 InternalIP", T, || internal(true)).await?;
    let v4 = internal(false).await.context("node-0's IPv4 InternalIP")?;

    let mut six = load_balancer_service("six", &[], &[(80, "http")]);
    let spec = six.spec.as_mut().context("spec")?;
    spec.ip_family_policy = Some("SingleStack".into());
    spec.ip_families = Some(vec!["IPv6".into()]);
    env.services.create(&PostParams::default(), &six).await?;
    env.service("four", None).await?;

    let address = env.ingress("six").await?;
    assert!(address.starts_with("fd00:2:"), "the IPv6 VIP: {address}");
    assert!(
        env.ingress("four").await?.starts_with("172.24.4."),
        "a floating IP"
    );
    let members_of = |service: &'static str| {
        let env = &env;
        async move {
            let lb = env.load_balancer(service).await?;
            let pools = env
                .project
                .octavia_list(
                    &format!("pools?loadbalancer_id={}", lb["id"].as_str().unwrap_or_default()),
                    "pools",
                )
                .await?;
            let pool = pools.first().context("a pool")?["id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            env.project
                .octavia_list(&format!("pools/{pool}/members"), "members")
                .await
        }
    };
    let six_members = members_of("six").await?;
    assert_eq!(six_members.len(), 1, "{six_members:?}");
    assert_eq!(six_members[0]["address"], v6.as_str());
    assert_eq!(six_members[0]["subnet_id"], v6_subnet.as_str());
    assert_eq!(
        env.load_balancer("six").await?["vip_subnet_id"],
        v6_subnet.as_str(),
        "the IPv6 VIP subnet, detected"
    );
    assert_eq!(
        env.load_balancer("four").await?["vip_subnet_id"],
        env.private.subnet_id.as_str()
    );
    let four_fip = env
        .project
        .floating_ips()
        .await?
        .into_iter()
        .find(|f| {
            f["description"]
                .as_str()
                .unwrap_or_default()
                .contains("default/four")
        })
        .context("four's floating IP")?;
    assert_eq!(
        four_fip["floating_network_id"],
        env.public.id.as_str(),
        "from the external network the VIP subnet's router uses"
    );
    let four_members = members_of("four").await?;
    assert_eq!(four_members[0]["address"], v4.as_str());
    assert_eq!(four_members[0]["subnet_id"], env.private.subnet_id.as_str());
    assert!(
        !env.project.floating_ips().await?.iter().any(|f| f["description"]
            .as_str()
            .unwrap_or_default()
            .contains("default/six")),
        "no floating IP made for the IPv6 Service"
    );
    env.delete_service("six").await?;
    env.delete_service("four").await?;
    Ok(())
}
