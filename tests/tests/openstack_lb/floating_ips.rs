//! Floating IPs: a user's own one, chosen through `spec.loadBalancerIP`, is used and kept.

use anyhow::Result;
use rcp_e2e::k8s::{ingress_ip, wait_for_event};

use crate::openstack_lb::env::*;

/// A user's own floating IP named in `spec.loadBalancerIP` is attached to the load balancer's
/// VIP port and is the Service's address; a second Service asking for it while it is attached
/// gets a Warning that says so; deleting the Service deletes the load balancer but never the
/// user's floating IP (detached, free again). An address the project does not hold is asked of
/// neutron, whose default policy refuses it to non-admins: a Warning says so.
#[tokio::test]
async fn a_users_own_floating_ip_in_load_balancer_ip_is_used_and_survives_the_service() -> Result<()> {
    let env = env("lb-own-fip").await?;
    let (fip_id, address) = env.users_own_floating_ip().await?;
    env.service("own", Some(&address)).await?;
    assert_eq!(env.ingress("own").await?, address, "the requested address");
    let lb = env.load_balancer("own").await?;
    assert_eq!(env.floating_ip(&fip_id).await?["port_id"], lb["vip_port_id"]);

    // Asked for by a second Service while attached: a Warning saying so, no address.
    env.service("thief", Some(&address)).await?;
    wait_for_event(&env.client, "default", "thief", T, |_, message| {
        message.contains(&format!("spec.loadBalancerIP {address}")) && message.contains("not free")
    })
    .await?;
    assert_eq!(ingress_ip(&env.services.get("thief").await?), None);
    env.delete_service("thief").await?;

    env.delete_service("own").await?;
    let left = env.floating_ip(&fip_id).await?;
    assert_eq!(
        left["floating_ip_address"],
        address.as_str(),
        "the user's floating IP is kept"
    );
    assert!(left["port_id"].is_null(), "and free again: {left}");

    // An address the project does not hold: the CCM asks neutron for a floating IP of that
    // address, which neutron's default policy allows admins only — a Warning names the address
    // and neutron's refusal, and the Service gets no address (nothing else is made instead).
    // Neutron hands floating IPs out at random from the pool, so the user's own one may be
    // .200 itself (the project would hold it and the CCM rightly use it): take another then.
    let wanted = ["172.24.4.200", "172.24.4.201"]
        .into_iter()
        .find(|candidate| *candidate != address)
        .expect("two candidates, one address");
    env.service("made", Some(wanted)).await?;
    wait_for_event(&env.client, "default", "made", T, |_, message| {
        message.contains(&format!(
            "creating the floating IP {wanted} (spec.loadBalancerIP)"
        )) && message.contains("disallowed by policy")
    })
    .await?;
    assert_eq!(ingress_ip(&env.services.get("made").await?), None);
    env.delete_service("made").await?;
    let after: Vec<_> = env
        .project
        .floating_ips()
        .await?
        .into_iter()
        .map(|f| f["floating_ip_address"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(after, [address], "only the user's floating IP is left");
    assert!(!env.ccm.log().contains(&env.project.password));
    Ok(())
}
