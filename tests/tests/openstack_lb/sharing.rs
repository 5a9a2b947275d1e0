//! Load balancers shared between Services (`loadbalancer.openstack.org/load-balancer-id`,
//! `[LoadBalancer] max-shared-lb`), as OCCM shares them.

use anyhow::{Context, Result};
use kube::api::{DeleteParams, PostParams};
use rcp_e2e::k8s::{load_balancer_service, wait_for, wait_for_event};

use crate::openstack_lb::env::*;

const LB_ID: &str = "loadbalancer.openstack.org/load-balancer-id";

impl Env {
    /// Creates the Service `name` on `port` with these annotations (full keys).
    async fn service_on(&self, name: &str, port: i32, annotations: &[(&str, &str)]) -> Result<()> {
        let mut svc = load_balancer_service(name, &[], &[(port, "p")]);
        svc.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        self.services.create(&PostParams::default(), &svc).await?;
        Ok(())
    }

    /// Deletes the Service and waits until it is gone (its finalizer removed).
    async fn delete_and_wait(&self, name: &str) -> Result<()> {
        self.services.delete(name, &DeleteParams::default()).await?;
        wait_for(&format!("{name} gone"), T, || async {
            self.services.get_opt(name).await.ok()?.is_none().then_some(())
        })
        .await
        .inspect_err(|_| eprintln!("{}", self.ccm.log()))
    }

    /// The load balancer `id`'s listeners as `(port, tags)`, sorted.
    async fn listeners_of(&self, id: &str) -> Result<Vec<(i64, Vec<String>)>> {
        let mut out: Vec<(i64, Vec<String>)> = self
            .project
            .octavia_list(&format!("listeners?loadbalancer_id={id}"), "listeners")
            .await?
            .iter()
            .map(|l| {
                (
                    l["protocol_port"].as_i64().unwrap_or_default(),
                    serde_json::from_value(l["tags"].clone()).unwrap_or_default(),
                )
            })
            .collect();
        out.sort();
        Ok(out)
    }
}

fn lb_name(service: &str) -> String {
    format!("kube_service_kubernetes_default_{service}")
}

/// Services share one load balancer through `load-balancer-id`, each with its own listeners
/// (tagged with its name) and the owner's floating IP; a port another Service listens on and a
/// Service past `max-shared-lb` are refused with a Warning; deleting the owner keeps the load
/// balancer for the others (only its listener and tag go); the last Service deleted takes the
/// load balancer and the owner's floating IP with it.
#[tokio::test]
async fn services_share_a_load_balancer_up_to_max_shared_lb() -> Result<()> {
    let env = env_full(
        "lb-share",
        Setup {
            load_balancer_lines: "max-shared-lb = 3\n",
            ..Default::default()
        },
    )
    .await?;
    env.service_on("owner", 80, &[]).await?;
    let address = env.ingress("owner").await?;
    let lb = env.load_balancer("owner").await?;
    let id = lb["id"].as_str().context("id")?.to_string();

    env.service_on("guest", 8080, &[(LB_ID, &id)]).await?;
    assert_eq!(env.ingress("guest").await?, address, "the owner's floating IP");
    // Refused: a port another Service listens on.
    env.service_on("clash", 80, &[(LB_ID, &id)]).await?;
    wait_for_event(&env.client, "default", "clash", T, |reason, message| {
        reason == "SyncLoadBalancerFailed" && message.contains("port 80") && message.contains("taken")
    })
    .await?;
    // A third Service; a fourth is refused: max-shared-lb counts every Service, the owner's
    // included.
    env.service_on("extra", 9090, &[(LB_ID, &id)]).await?;
    assert_eq!(env.ingress("extra").await?, address);
    env.service_on("over", 7070, &[(LB_ID, &id)]).await?;
    wait_for_event(&env.client, "default", "over", T, |reason, message| {
        reason == "SyncLoadBalancerFailed" && message.contains("already shared by 3 Services")
    })
    .await?;
    assert_eq!(
        env.listeners_of(&id).await?,
        [
            (80, vec![lb_name("owner")]),
            (8080, vec![lb_name("guest")]),
            (9090, vec![lb_name("extra")]),
        ],
        "one listener per Service, tagged with its name; none for the refused ones"
    );
    let tags = env.load_balancer("owner").await?["tags"].clone();
    let tags: Vec<&str> = tags
        .as_array()
        .context("tags")?
        .iter()
        .filter_map(|t| t.as_str())
        .collect();
    for s in ["owner", "guest", "extra"] {
        assert!(
            tags.contains(&lb_name(s).as_str()),
            "{s} in the load balancer's tags: {tags:?}"
        );
    }
    assert_eq!(tags.len(), 3, "not the refused ones: {tags:?}");
    assert_eq!(
        env.project
            .octavia_list("loadbalancers", "loadbalancers")
            .await?
            .len(),
        1,
        "no other load balancer made"
    );

    // The owner goes: the load balancer stays for the others.
    env.delete_and_wait("owner").await?;
    env.delete_and_wait("clash").await?;
    env.delete_and_wait("over").await?;
    let kept = env.project.load_balancers(&lb_name("owner")).await?;
    assert_eq!(kept.len(), 1, "kept for guest and extra: {kept:?}");
    assert!(
        !kept[0]["tags"]
            .as_array()
            .context("tags")?
            .iter()
            .any(|t| *t == lb_name("owner")),
        "the owner's tag went: {}",
        kept[0]["tags"]
    );
    assert_eq!(
        env.listeners_of(&id).await?,
        [(8080, vec![lb_name("guest")]), (9090, vec![lb_name("extra")])],
        "only the owner's listener went"
    );
    assert!(
        env.has_floating_ip(&address).await?,
        "the floating IP stays with the load balancer"
    );

    // The last Service takes the load balancer and the owner's floating IP with it.
    env.delete_and_wait("guest").await?;
    assert_eq!(
        env.project.load_balancers(&lb_name("owner")).await?.len(),
        1,
        "extra still uses it"
    );
    env.delete_and_wait("extra").await?;
    wait_for("the shared load balancer deleted", T, || async {
        env.project
            .load_balancers(&lb_name("owner"))
            .await
            .ok()?
            .is_empty()
            .then_some(())
    })
    .await
    .inspect_err(|_| eprintln!("{}", env.ccm.log()))?;
    assert!(
        !env.has_floating_ip(&address).await?,
        "the owner's floating IP went with it"
    );
    Ok(())
}
