//! Taking over from OCCM without a write: load balancers made the way OCCM makes them, under
//! its current names and under the legacy `a<uid>` name.

use anyhow::{Context, Result};
use kube::api::{Patch, PatchParams, PostParams};
use rcp_e2e::{
    k8s::{load_balancer_service, wait_for},
    openstack::{NEUTRON, OCTAVIA},
};
use serde_json::json;

use crate::openstack_lb::env::*;

/// A load balancer named `lb_name` made for the Service `service` (already a NodePort Service)
/// exactly as OCCM leaves one: the load balancer tagged with the Service's current load
/// balancer name, listener `listener_0_<lb>` on port 80 and pool `pool_0_<lb>` tagged the
/// same, `node-0` as member, and a floating IP with OCCM's description; with a TLS
/// certificate reference, OCCM's `TERMINATED_HTTPS` listener and HTTP pool. Returns the load
/// balancer's ID and the floating IP's address.
async fn occm_load_balancer(
    env: &Env,
    lb_name: &str,
    service: &str,
    tls: Option<&str>,
) -> Result<(String, String)> {
    let node_port = env.node_port(service).await?;
    let tag = format!("kube_service_kubernetes_default_{service}");
    let s = &env.project.session;
    let lb = s
        .post(
            &format!("{OCTAVIA}/lbaas/loadbalancers"),
            json!({"loadbalancer": {"name": lb_name, "vip_subnet_id": env.private.subnet_id, "tags": [tag],
                   "description": format!("Kubernetes external service default/{service} from cluster kubernetes")}}),
        )
        .await?;
    let lb_id = lb["loadbalancer"]["id"].as_str().context("id")?.to_string();
    let vip_port = lb["loadbalancer"]["vip_port_id"]
        .as_str()
        .context("vip port")?
        .to_string();
    let active = || async {
        let lbs = env.project.load_balancers(lb_name).await.ok()?;
        (lbs.first()?["provisioning_status"] == "ACTIVE").then_some(())
    };
    wait_for("OCCM's load balancer active", T, active).await?;
    let mut listener = json!({"name": format!("listener_0_{lb_name}"), "protocol": "TCP", "protocol_port": 80,
                              "loadbalancer_id": lb_id, "connection_limit": -1, "tags": [tag]});
    if let Some(reference) = tls {
        listener["protocol"] = json!("TERMINATED_HTTPS");
        listener["default_tls_container_ref"] = json!(reference);
    }
    let listener = s
        .post(
            &format!("{OCTAVIA}/lbaas/listeners"),
            json!({"listener": listener}),
        )
        .await?;
    wait_for("listener made", T, active).await?;
    let pool = s
        .post(
            &format!("{OCTAVIA}/lbaas/pools"),
            json!({"pool": {"name": format!("pool_0_{lb_name}"), "protocol": if tls.is_some() { "HTTP" } else { "TCP" }, "lb_algorithm": "ROUND_ROBIN",
                   "listener_id": listener["listener"]["id"], "tags": [tag]}}),
        )
        .await?;
    wait_for("pool made", T, active).await?;
    let pool_id = pool["pool"]["id"].as_str().context("pool id")?.to_string();
    let servers = s
        .get(&format!("{}/servers/detail", rcp_e2e::openstack::NOVA))
        .await?;
    let ip = servers["servers"][0]["addresses"]["private"][0]["addr"]
        .as_str()
        .context("node-0's address")?
        .to_string();
    s.put(
        &format!("{OCTAVIA}/lbaas/pools/{pool_id}/members"),
        json!({"members": [{"name": "node-0", "address": ip, "protocol_port": node_port, "subnet_id": env.private.subnet_id}]}),
    )
    .await?;
    wait_for("member made", T, active).await?;
    let fip = s
        .post(
            &format!("{NEUTRON}/floatingips"),
            json!({"floatingip": {"floating_network_id": env.public.id, "port_id": vip_port,
                   "description": format!("Floating IP for Kubernetes external service default/{service} from cluster kubernetes")}}),
        )
        .await?;
    let address = fip["floatingip"]["floating_ip_address"]
        .as_str()
        .context("address")?
        .to_string();
    Ok((lb_id, address))
}

/// Creates the Service `name` as a NodePort Service (a node port for OCCM's members).
async fn node_port_service(env: &Env, name: &str) -> Result<()> {
    let mut svc = load_balancer_service(name, &[], &[(80, "http")]);
    svc.spec.as_mut().context("spec")?.type_ = Some("NodePort".into());
    env.services.create(&PostParams::default(), &svc).await?;
    Ok(())
}

/// Makes the Service `type: LoadBalancer`, waits for its address, syncs it once more, and
/// returns the address and every request method/path neutron and Octavia saw meanwhile.
async fn take_over(env: &Env, name: &str) -> Result<(String, Vec<String>)> {
    for p in [&env.project.neutron_proxy, &env.project.octavia_proxy] {
        p.reset_counts();
    }
    env.services
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "LoadBalancer"}})),
        )
        .await?;
    let address = env.ingress(name).await?;
    // A second sync (as a node sync or a resync would) finds nothing to change either.
    env.sync_again(name).await?;
    let mut seen = std::collections::BTreeMap::new();
    for p in [&env.project.neutron_proxy, &env.project.octavia_proxy] {
        seen.extend(p.counts_by_method());
    }
    assert!(
        seen.keys().any(|k| k.starts_with("GET ")),
        "the CCM read OCCM's load balancer: {seen:?}"
    );
    Ok((address, seen.into_keys().collect()))
}

fn writes(seen: &[String]) -> Vec<&String> {
    seen.iter().filter(|k| !k.starts_with("GET ")).collect()
}

/// Taking over from OCCM: a load balancer made the way OCCM makes it (its names for the load
/// balancer, listener, pool and members, its floating-IP description), found by the CCM when
/// the Service becomes `type: LoadBalancer`, is adopted with zero writes to Octavia and neutron
/// over two syncs: the Service gets its address, nothing is made again, and deleting the
/// Service deletes both.
#[tokio::test]
async fn a_load_balancer_made_by_occm_is_adopted_without_a_write() -> Result<()> {
    let env = env("lb-adopt").await?;
    node_port_service(&env, "adopt").await?;
    let name = "kube_service_kubernetes_default_adopt";
    let (lb_id, address) = occm_load_balancer(&env, name, "adopt", None).await?;
    let (ingress, seen) = take_over(&env, "adopt").await?;
    assert_eq!(ingress, address, "OCCM's floating IP");
    assert!(writes(&seen).is_empty(), "adoption wrote: {seen:?}");
    assert_eq!(
        env.load_balancer("adopt").await?["id"],
        lb_id.as_str(),
        "not made again"
    );

    env.delete_service("adopt").await?;
    assert!(
        !env.has_floating_ip(&address).await?,
        "OCCM's floating IP, made for the Service, went with it"
    );
    Ok(())
}

/// A load balancer under the legacy name (`a` and the Service's UID without dashes, 32
/// characters: the in-tree provider's and early OCCM's) is found when none has the current
/// name, and adopted with zero writes over two syncs. As OCCM, deleting the Service deletes
/// only its listeners and takes its tag off: a load balancer not named `kube_service_…` is
/// never deleted (nor its floating IP).
#[tokio::test]
async fn a_load_balancer_under_the_legacy_name_is_adopted_and_never_deleted() -> Result<()> {
    let env = env("lb-legacy").await?;
    node_port_service(&env, "old").await?;
    let uid = env.services.get("old").await?.metadata.uid.context("uid")?;
    let mut legacy = format!("a{}", uid.replace('-', ""));
    legacy.truncate(32);
    let (lb_id, address) = occm_load_balancer(&env, &legacy, "old", None).await?;
    let (ingress, seen) = take_over(&env, "old").await?;
    assert_eq!(ingress, address, "the legacy load balancer's floating IP");
    assert!(writes(&seen).is_empty(), "adoption wrote: {seen:?}");
    assert!(
        env.project
            .load_balancers("kube_service_kubernetes_default_old")
            .await?
            .is_empty(),
        "no second load balancer under the current name"
    );

    env.delete_service("old").await?;
    let kept = env.project.load_balancers(&legacy).await?;
    assert_eq!(kept.len(), 1, "the legacy load balancer is kept: {kept:?}");
    assert_eq!(kept[0]["id"], lb_id.as_str());
    let listeners = env
        .project
        .octavia_list(&format!("listeners?loadbalancer_id={lb_id}"), "listeners")
        .await?;
    assert!(listeners.is_empty(), "the Service's listener went: {listeners:?}");
    assert!(
        !kept[0]["tags"]
            .as_array()
            .context("tags")?
            .iter()
            .any(|t| t == "kube_service_kubernetes_default_old"),
        "the Service's tag went: {}",
        kept[0]["tags"]
    );
    assert!(
        env.has_floating_ip(&address).await?,
        "its floating IP is kept with it"
    );
    Ok(())
}

/// OCCM's TLS-terminating load balancer (`[LoadBalancer] default-tls-container-ref`, a
/// `TERMINATED_HTTPS` listener with the certificate and an HTTP pool) is adopted with zero
/// writes over two syncs: before TLS termination was built, the take-over replaced the listener
/// with a plain TCP one, and the backends suddenly received TLS.
#[tokio::test]
async fn an_occm_tls_terminating_load_balancer_is_adopted_without_a_write() -> Result<()> {
    let env = env_full(
        "lb-adopt-tls",
        Setup {
            load_balancer_lines: "default-tls-container-ref = ${TLS_SECRET}\n",
            ..Default::default()
        },
    )
    .await?;
    let certificate = env.tls_secret.clone().context("the config's certificate")?;
    node_port_service(&env, "secure").await?;
    let name = "kube_service_kubernetes_default_secure";
    let (lb_id, address) = occm_load_balancer(&env, name, "secure", Some(&certificate)).await?;
    let (ingress, seen) = take_over(&env, "secure").await?;
    assert_eq!(ingress, address, "OCCM's floating IP");
    assert!(writes(&seen).is_empty(), "adoption wrote: {seen:?}");
    let o = env.octavia_objects(&lb_id).await?;
    assert_eq!(o.listeners.len(), 1, "{:?}", o.listeners);
    assert_eq!(o.listeners[0]["protocol"], "TERMINATED_HTTPS");
    assert_eq!(o.listeners[0]["default_tls_container_ref"], certificate.as_str());
    assert_eq!(o.pools[0]["protocol"], "HTTP");
    env.delete_service("secure").await?;
    Ok(())
}
