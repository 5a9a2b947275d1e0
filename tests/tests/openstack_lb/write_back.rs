//! What the CCM writes back on a Service, as OCCM: `load-balancer-id` and
//! `load-balancer-address`; stale ones are cleared or replaced.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Patch, PatchParams, PostParams};
use rcp_e2e::k8s::{load_balancer_service, wait_for, wait_for_event, wait_for_ingress};
use serde_json::json;

use crate::openstack_lb::env::*;

const ID: &str = "loadbalancer.openstack.org/load-balancer-id";
const ADDRESS: &str = "loadbalancer.openstack.org/load-balancer-address";

fn annotation(s: &Service, key: &str) -> Option<String> {
    s.metadata.annotations.as_ref()?.get(key).cloned()
}

/// A Service with the `…/hostname` annotation shows the hostname in its status and gets its
/// load balancer's ID and its real address (the floating IP) as annotations; switched to
/// `NodePort` its load balancer goes and so do both annotations (OCCM keeps the ID, and the
/// Service then fails when it comes back: OCCM #2751); back to `LoadBalancer` it gets a new
/// load balancer and its ID. A Service carrying the annotations OCCM left for a load balancer
/// that is gone gets its own load balancer and the ID is replaced; an ID a user set alone for a
/// load balancer that does not exist stays an error (the Service is meant to share).
#[tokio::test]
async fn the_load_balancer_id_and_address_are_written_back_and_stale_ones_replaced() -> Result<()> {
    let env = env("lb-notes").await?;
    let mut svc = load_balancer_service("named", &[], &[(80, "http")]);
    svc.metadata.annotations = Some(
        [(
            "loadbalancer.openstack.org/hostname".to_string(),
            "web.example.com".to_string(),
        )]
        .into(),
    );
    env.services.create(&PostParams::default(), &svc).await?;
    let annotated = |name: &'static str| {
        let env = &env;
        async move {
            wait_for(&format!("{name}'s annotations"), T, || async {
                let s = env.services.get(name).await.ok()?;
                Some((annotation(&s, ID)?, annotation(&s, ADDRESS)?))
            })
            .await
            .inspect_err(|_| eprintln!("{}", env.ccm.log()))
        }
    };
    let (id, address) = annotated("named").await?;
    let lb = env.load_balancer("named").await?;
    assert_eq!(lb["id"], id.as_str());
    let fips = env.project.floating_ips().await?;
    assert_eq!(fips.len(), 1, "{fips:?}");
    assert_eq!(
        fips[0]["floating_ip_address"],
        address.as_str(),
        "the real address"
    );
    // The annotations are written with the load balancer, the status after it (as OCCM and
    // the service controller do): the status may come a moment later.
    let status = wait_for_ingress(&env.services, "named", T)
        .await?
        .status
        .context("status")?;
    let ingress = status.load_balancer.context("lb")?.ingress.context("ingress")?;
    assert_eq!(ingress[0].hostname.as_deref(), Some("web.example.com"));

    // NodePort: the load balancer and both annotations go.
    env.services
        .patch(
            "named",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "NodePort"}})),
        )
        .await?;
    wait_for(
        "named's load balancer gone and its annotations cleared",
        T,
        || async {
            let s = env.services.get("named").await.ok()?;
            let lbs = env
                .project
                .load_balancers("kube_service_kubernetes_default_named")
                .await
                .ok()?;
            (lbs.is_empty() && annotation(&s, ID).is_none() && annotation(&s, ADDRESS).is_none())
                .then_some(())
        },
    )
    .await
    .inspect_err(|_| eprintln!("{}", env.ccm.log()))?;

    // Back to LoadBalancer: a new load balancer, its ID written.
    env.services
        .patch(
            "named",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "LoadBalancer"}})),
        )
        .await?;
    let (again, _) = annotated("named").await?;
    assert_ne!(again, id, "a new load balancer");
    assert_eq!(env.load_balancer("named").await?["id"], again.as_str());
    env.delete_service("named").await?;

    // OCCM's annotations for a load balancer that is gone: replaced.
    let gone = "6b1a34b6-0d6f-4f7e-9a43-1f2a7c0b9e11";
    let mut migrated = load_balancer_service("migrated", &[], &[(80, "http")]);
    migrated.metadata.annotations = Some(
        [(ID, gone), (ADDRESS, "172.24.4.250")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    env.services.create(&PostParams::default(), &migrated).await?;
    wait_for("migrated's ID replaced", T, || async {
        let s = env.services.get("migrated").await.ok()?;
        let id = annotation(&s, ID)?;
        let address = annotation(&s, ADDRESS)?;
        // The new address may be .250 again by chance (neutron picks at random): it must be
        // the Service's own ingress address, whatever it is.
        let ingress = rcp_e2e::k8s::ingress_ip(&s)?;
        (id != gone && address == ingress).then_some(())
    })
    .await
    .inspect_err(|_| eprintln!("{}", env.ccm.log()))?;
    let own = env.load_balancer("migrated").await?;
    assert_eq!(
        annotation(&env.services.get("migrated").await?, ID).as_deref(),
        own["id"].as_str()
    );

    // An ID a user set alone: an error naming it, no load balancer made.
    let mut sharer = load_balancer_service("sharer", &[], &[(80, "http")]);
    sharer.metadata.annotations = Some([(ID.to_string(), gone.to_string())].into());
    env.services.create(&PostParams::default(), &sharer).await?;
    wait_for_event(&env.client, "default", "sharer", T, |_, message| {
        message.contains(&format!("Octavia has no load balancer {gone}"))
    })
    .await?;
    assert!(
        env.project
            .load_balancers("kube_service_kubernetes_default_sharer")
            .await?
            .is_empty()
    );
    env.delete_service("sharer").await?;
    env.delete_service("migrated").await?;
    Ok(())
}
