//! TLS termination with certificates in a real barbican: `TERMINATED_HTTPS` listeners whose
//! certificate Octavia itself reads (the API checks every reference), changed in place, a
//! reference barbican lacks refused before anything changes, and switched off again.

use anyhow::{Context, Result};
use kube::api::{Patch, PatchParams, PostParams};
use rcp_e2e::{
    k8s::{load_balancer_service, wait_for, wait_for_event},
    openstack::BARBICAN,
};
use serde_json::{Value, json};

use crate::openstack_lb::env::*;

const TLS_REF: &str = "loadbalancer.openstack.org/default-tls-container-ref";

/// The Service's one listener and its pool, as Octavia reports them.
async fn listener_and_pool(env: &Env, lb_id: &str) -> Result<(Value, Value)> {
    let o = env.octavia_objects(lb_id).await?;
    anyhow::ensure!(o.listeners.len() == 1, "one listener: {:?}", o.listeners);
    anyhow::ensure!(o.pools.len() == 1, "one pool: {:?}", o.pools);
    Ok((o.listeners[0].clone(), o.pools[0].clone()))
}

async fn annotate(env: &Env, name: &str, value: &str) -> Result<()> {
    env.services
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {TLS_REF: value}}})),
        )
        .await?;
    Ok(())
}

/// A Service annotated with a PKCS#12 secret gets a `TERMINATED_HTTPS` listener with that
/// certificate and an HTTP pool (OCCM), Octavia having read the secret (it granted its service
/// user read access: barbican's ACL shows it); a certificate container replaces it in place;
/// a reference barbican lacks is an Event naming it and changes nothing; an empty annotation
/// switches TLS termination off (a plain TCP listener and pool again).
#[tokio::test]
async fn a_service_terminates_tls_with_its_barbican_certificate() -> Result<()> {
    let env = env("lb-tls").await?;
    let secret = env.project.tls_secret("web.example").await?;
    let container = env.project.tls_container("web2.example").await?;
    let mut svc = load_balancer_service("web", &[], &[(443, "https")]);
    svc.metadata.annotations = Some([(TLS_REF.to_string(), secret.clone())].into());
    env.services.create(&PostParams::default(), &svc).await?;
    env.ingress("web").await?;
    let lb_id = env.load_balancer("web").await?["id"]
        .as_str()
        .context("id")?
        .to_string();
    let (listener, pool) = listener_and_pool(&env, &lb_id).await?;
    println!("the TLS-terminating listener as Octavia reports it:\n{listener:#}");
    assert_eq!(listener["protocol"], "TERMINATED_HTTPS");
    assert_eq!(listener["protocol_port"], 443);
    assert_eq!(listener["default_tls_container_ref"], secret.as_str());
    assert_eq!(pool["protocol"], "HTTP", "the members get plain HTTP");
    let acl = env.project.session.get(&format!("{secret}/acl")).await?;
    assert!(
        acl["read"]["users"].as_array().is_some_and(|u| !u.is_empty()),
        "Octavia granted its service user read access to the certificate: {acl}"
    );

    // Another certificate (a container): the listener is updated in place.
    annotate(&env, "web", &container).await?;
    let listener_id = listener["id"].clone();
    wait_for("the listener has the container", T, || async {
        let (l, _) = listener_and_pool(&env, &lb_id).await.ok()?;
        (l["default_tls_container_ref"] == container.as_str()).then_some(())
    })
    .await?;
    let (l, _) = listener_and_pool(&env, &lb_id).await?;
    assert_eq!(l["id"], listener_id, "updated, not made again");

    // A reference barbican does not have: an Event, and the listener keeps its certificate.
    let missing = format!("{BARBICAN}/secrets/00000000-0000-4000-8000-000000000000");
    annotate(&env, "web", &missing).await?;
    wait_for_event(&env.client, "default", "web", T, |reason, message| {
        reason == "SyncLoadBalancerFailed"
            && message.contains(&missing)
            && message.contains("barbican has no such secret")
    })
    .await?;
    let (l, _) = listener_and_pool(&env, &lb_id).await?;
    assert_eq!(l["default_tls_container_ref"], container.as_str(), "unchanged");

    // Set and empty: no TLS termination.
    annotate(&env, "web", "").await?;
    wait_for("a TCP listener and pool again", T, || async {
        let (l, p) = listener_and_pool(&env, &lb_id).await.ok()?;
        (l["protocol"] == "TCP" && p["protocol"] == "TCP").then_some(())
    })
    .await?;
    env.delete_service("web").await?;
    Ok(())
}
