//! Octavia's states: a load balancer in `ERROR` (forced in Octavia's database: the no-op
//! drivers never fail) is left while it may serve, deleted with its Service, or made again.

use anyhow::{Context, Result};
use kube::api::{Patch, PatchParams};
use rcp_e2e::{
    k8s::{events_for, ingress_ip, wait_for, wait_for_event},
    openstack::OCTAVIA,
};
use serde_json::json;

use crate::openstack_lb::env::*;

/// A load balancer that served and went into `ERROR` is left as it is (it may still serve) with
/// a Warning saying so; deleting the Service deletes it (Octavia deletes a load balancer in
/// `ERROR`) and the floating IP made for it, and the finalizer goes.
#[tokio::test]
async fn a_load_balancer_in_error_is_left_while_its_service_lives_and_deleted_with_it() -> Result<()> {
    let env = env("lb-error").await?;
    env.service("broken", None).await?;
    let address = env.ingress("broken").await?;
    let lb = env.load_balancer("broken").await?;
    let lb_id = lb["id"].as_str().context("id")?.to_string();
    env.os
        .octavia_sql(&format!(
            "UPDATE load_balancer SET provisioning_status = 'ERROR' WHERE id = '{lb_id}'"
        ))
        .await?;
    assert_eq!(env.load_balancer("broken").await?["provisioning_status"], "ERROR");

    // A change makes the controller sync the Service: the load balancer is left alone.
    env.services
        .patch(
            "broken",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"loadbalancer.openstack.org/lb-method": "LEAST_CONNECTIONS"}}})),
        )
        .await?;
    wait_for_event(&env.client, "default", "broken", T, |_, message| {
        message.contains("is in ERROR in Octavia: left as it is")
    })
    .await
    .inspect_err(|_| eprintln!("{}", env.ccm.log()))?;
    let still = env.load_balancer("broken").await?;
    assert_eq!(still["id"], lb_id.as_str(), "not deleted on doubt");
    assert_eq!(ingress_ip(&env.services.get("broken").await?), Some(address));

    env.delete_service("broken").await?;
    assert!(
        env.project.floating_ips().await?.is_empty(),
        "the floating IP made for the Service went with it"
    );
    Ok(())
}

/// A load balancer of the Service's name found in `ERROR` before the Service ever had an
/// address (its creating sync was cut short) is deleted and made again, as OCCM does with one
/// that goes into `ERROR` when it is made; the Service gets an address and a Warning said why.
#[tokio::test]
async fn a_load_balancer_in_error_that_never_served_is_deleted_and_made_again() -> Result<()> {
    let env = env("lb-remake").await?;
    let first = env
        .project
        .session
        .post(
            &format!("{OCTAVIA}/lbaas/loadbalancers"),
            json!({"loadbalancer": {"name": "kube_service_kubernetes_default_fresh", "vip_subnet_id": env.private.subnet_id}}),
        )
        .await?;
    let first_id = first["loadbalancer"]["id"].as_str().context("id")?.to_string();
    wait_for("the first load balancer settled", T, || async {
        let lbs = env
            .project
            .load_balancers("kube_service_kubernetes_default_fresh")
            .await
            .ok()?;
        (lbs.first()?["provisioning_status"] == "ACTIVE").then_some(())
    })
    .await?;
    env.os
        .octavia_sql(&format!(
            "UPDATE load_balancer SET provisioning_status = 'ERROR' WHERE id = '{first_id}'"
        ))
        .await?;
    env.service("fresh", None).await?;
    env.ingress("fresh").await?;
    let lb = env.load_balancer("fresh").await?;
    assert_ne!(lb["id"], first_id.as_str(), "a new load balancer");
    assert_eq!(lb["provisioning_status"], "ACTIVE");
    let events = events_for(&env.client, "default", "fresh").await?;
    assert!(
        events
            .iter()
            .any(|(_, message, _)| message.contains("went into ERROR in Octavia when it was made")),
        "{events:?}"
    );
    env.delete_service("fresh").await?;
    Ok(())
}

/// `OCCM_WAIT_LB_ACTIVE_STEPS` (OCCM's environment variable) bounds the wait for Octavia: with
/// 3 steps (about 3.6 s) a load balancer stuck in `PENDING_UPDATE` fails the sync within
/// seconds with an error saying how long it waited (the default, 300 s, would still be waiting
/// when this test gives up); once Octavia has it `ACTIVE` again, the Service syncs.
#[tokio::test]
async fn occm_wait_lb_active_steps_bounds_the_wait_for_octavia() -> Result<()> {
    let env = env_full(
        "lb-wait",
        Setup {
            ccm_env: &[("OCCM_WAIT_LB_ACTIVE_STEPS", "3")],
            ..Default::default()
        },
    )
    .await?;
    env.service("stuck", None).await?;
    env.ingress("stuck").await?;
    let lb_id = env.load_balancer("stuck").await?["id"]
        .as_str()
        .context("id")?
        .to_string();
    env.os
        .octavia_sql(&format!(
            "UPDATE load_balancer SET provisioning_status = 'PENDING_UPDATE' WHERE id = '{lb_id}'"
        ))
        .await?;
    env.services
        .patch(
            "stuck",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"test.example/sync": "1"}}})),
        )
        .await?;
    wait_for_event(&env.client, "default", "stuck", T, |_, message| {
        message.contains(&format!(
            "Octavia load balancer {lb_id} is still provisioning after 3.6 s"
        ))
    })
    .await
    .inspect_err(|_| eprintln!("{}", env.ccm.log()))?;
    env.os
        .octavia_sql(&format!(
            "UPDATE load_balancer SET provisioning_status = 'ACTIVE' WHERE id = '{lb_id}'"
        ))
        .await?;
    env.delete_service("stuck").await?;
    Ok(())
}
