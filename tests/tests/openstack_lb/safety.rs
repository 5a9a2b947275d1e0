//! Shadow mode writes nothing; `orphans` lists and deletes only what no Service wants.

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use rcp_e2e::k8s::{initialised, tainted_node, wait_for};
use serde_json::json;

use crate::openstack_lb::env::*;

/// Shadow mode (`--dry-run`) writes nothing in OpenStack: the controllers announce the load
/// balancer they would make, and nova, neutron and octavia (each behind the project's proxy)
/// see reads only; no load balancer exists and the Node stays tainted. (The OpenStack client
/// also refuses every write itself under `--dry-run`: a unit test of `client.rs`.)
#[tokio::test]
async fn shadow_mode_sends_no_write_to_openstack() -> Result<()> {
    let env = env_with("lb-shadow", &["--dry-run"]).await?;
    env.service("shadow", None).await?;
    wait_for("the shadow run to announce the load balancer", T, || {
        let log = env.ccm.log();
        let announced = log.lines().any(|l| {
            l.contains("would write") && l.contains("EnsureLoadBalancer") && l.contains("default/shadow")
        });
        async move { announced.then_some(()) }
    })
    .await
    .inspect_err(|_| eprintln!("{}", env.ccm.log()))?;
    // The node controller's pass and a lifecycle pass happen meanwhile.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let mut seen = std::collections::BTreeMap::new();
    for proxy in [
        &env.project.nova_proxy,
        &env.project.neutron_proxy,
        &env.project.octavia_proxy,
    ] {
        seen.extend(proxy.counts_by_method());
    }
    println!("OpenStack requests of the shadow run: {seen:?}");
    assert!(
        seen.keys().any(|k| k.starts_with("GET ")),
        "the shadow run read the cloud: {seen:?}"
    );
    let writes: Vec<&String> = seen.keys().filter(|k| !k.starts_with("GET ")).collect();
    assert!(writes.is_empty(), "writes sent in shadow mode: {writes:?}");
    assert!(
        env.project
            .load_balancers("kube_service_kubernetes_default_shadow")
            .await?
            .is_empty()
    );
    let nodes: Api<Node> = Api::all(env.client.clone());
    assert!(
        initialised(&nodes, "node-0").await.is_none(),
        "node-0 is still tainted"
    );
    Ok(())
}

/// Runs `cloud-controller-manager-openstack orphans <args>` for the Env's cloud config:
/// `(exit code, stdout)`.
pub(crate) async fn orphans(env: &Env, test: &str, extra: &[&str]) -> Result<(i32, String)> {
    let out = tokio::process::Command::new(rcp_e2e::paths::workspace_binary(
        "cloud-controller-manager-openstack",
    )?)
    .arg("orphans")
    .arg("--output=tsv")
    .arg(format!(
        "--cloud-config={}",
        env.cluster.dir().join(format!("ccm-{test}.conf")).display()
    ))
    .arg(format!(
        "--kubeconfig={}",
        env.cluster.ccm_kubeconfig("openstack/base")?.display()
    ))
    .args(extra)
    .env("RUST_LOG", "off")
    .output()
    .await?;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    println!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    Ok((out.status.code().unwrap_or(-1), stdout))
}

/// What a stopped CCM left behind — the load balancer and floating IP of a Service deleted
/// without its cleanup — is listed by `orphans` (and nothing else: not the load balancer of a
/// live Service, not a user's own floating IP), deleted by `orphans --delete --yes`, and then
/// there are none.
#[tokio::test]
async fn orphans_lists_and_deletes_only_what_no_service_wants() -> Result<()> {
    let mut env = env("lb-orphans").await?;
    for name in ["live", "gone"] {
        env.service(name, None).await?;
    }
    let gone_address = env.ingress("gone").await?;
    env.ingress("live").await?;
    let (_, mine) = env.users_own_floating_ip().await?;
    // The CCM stops for good; then "gone" is deleted without its cleanup.
    env.ccm.signal(nix::sys::signal::Signal::SIGTERM)?;
    env.ccm.wait_exit(Duration::from_secs(30))?;
    env.services
        .patch(
            "gone",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    env.services.delete("gone", &DeleteParams::default()).await?;
    wait_for("gone deleted", T, || async {
        env.services.get_opt("gone").await.ok()?.is_none().then_some(())
    })
    .await?;

    let (code, out) = orphans(&env, "lb-orphans", &[]).await?;
    assert_eq!(code, 0, "{out}");
    let listed: Vec<(String, String)> = out
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f.len() == 5).then(|| (f[0].to_string(), f[1].to_string()))
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("floating-ip".to_string(), gone_address.clone()),
            (
                "load-balancer".to_string(),
                "kube_service_kubernetes_default_gone".to_string()
            ),
        ],
        "{out}"
    );
    assert_eq!(
        env.project
            .load_balancers("kube_service_kubernetes_default_gone")
            .await?
            .len(),
        1,
        "listing deletes nothing"
    );

    // A kubeconfig whose cluster has a Node on a server this project does not have (another
    // project's cluster, paired with this cloud config): refused before anything is deleted.
    let nodes: Api<Node> = Api::all(env.client.clone());
    let mut stranger = tainted_node("stranger");
    stranger.spec.get_or_insert_default().provider_id =
        Some("openstack:///9d3c1c4e-0000-4000-8000-000000000001".into());
    nodes.create(&PostParams::default(), &stranger).await?;
    let (code, out) = orphans(&env, "lb-orphans", &["--delete", "--yes"]).await?;
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        env.project
            .load_balancers("kube_service_kubernetes_default_gone")
            .await?
            .len(),
        1,
        "nothing deleted for a cluster of another project: {out}"
    );
    nodes.delete("stranger", &DeleteParams::default()).await?;

    let (code, out) = orphans(&env, "lb-orphans", &["--delete", "--yes"]).await?;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("Same cluster: the servers of the cluster's 1 Node(s)"),
        "{out}"
    );
    assert!(
        env.project
            .load_balancers("kube_service_kubernetes_default_gone")
            .await?
            .is_empty()
    );
    assert_eq!(
        env.project
            .load_balancers("kube_service_kubernetes_default_live")
            .await?
            .len(),
        1
    );
    let addresses: Vec<String> = env
        .project
        .floating_ips()
        .await?
        .iter()
        .filter_map(|f| f["floating_ip_address"].as_str().map(str::to_string))
        .collect();
    assert!(
        addresses.contains(&mine),
        "the user's own floating IP is kept: {addresses:?}"
    );
    assert!(!addresses.contains(&gone_address), "{addresses:?}");
    assert_eq!(addresses.len(), 2, "live's and the user's: {addresses:?}");
    let (code, out) = orphans(&env, "lb-orphans", &[]).await?;
    assert_eq!(code, 0);
    assert!(out.starts_with("No orphans"), "{out}");
    Ok(())
}
