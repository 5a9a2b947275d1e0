//! `manage-security-groups` as OCCM: the Service's `lb-sg-<uid>-<namespace>-<name>` group opens
//! its NodePorts to the members' subnet on each member Node's port and goes with the Service;
//! OCCM's group is adopted without a write while the option is off, and `orphans` finds a
//! leaked one (never another cluster's).

use std::collections::BTreeSet;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use rcp_e2e::{
    k8s::{initialised, load_balancer_service, tainted_node, wait_for},
    openstack::NEUTRON,
};
use serde_json::{Value, json};

use crate::openstack_lb::env::*;

/// The security groups of that name.
async fn groups_named(env: &Env, name: &str) -> Result<Vec<Value>> {
    let v = env
        .project
        .session
        .get(&format!("{NEUTRON}/security-groups?name={name}"))
        .await?;
    Ok(v["security_groups"].as_array().cloned().unwrap_or_default())
}

/// `(direction, protocol, remote prefix, port)` of each rule of the group.
async fn rules_of(env: &Env, group: &str) -> Result<BTreeSet<(String, String, String, i64)>> {
    let v = env
        .project
        .session
        .get(&format!(
            "{NEUTRON}/security-group-rules?security_group_id={group}"
        ))
        .await?;
    Ok(v["security_group_rules"]
        .as_array()
        .context("rules")?
        .iter()
        .map(|r| {
            (
                r["direction"].as_str().unwrap_or_default().to_string(),
                r["protocol"].as_str().unwrap_or_default().to_string(),
                r["remote_ip_prefix"].as_str().unwrap_or_default().to_string(),
                r["port_range_min"].as_i64().unwrap_or_default(),
            )
        })
        .collect())
}

/// The neutron port with the Node's InternalIP: `(port ID, its security groups)`.
async fn port_of_node(env: &Env, node: &str) -> Result<(String, Vec<String>)> {
    let nodes: Api<Node> = Api::all(env.client.clone());
    let n = nodes.get(node).await?;
    let ip = n
        .status
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .find(|a| a.type_ == "InternalIP")
        .context("InternalIP")?
        .address;
    let v = env
        .project
        .session
        .get(&format!("{NEUTRON}/ports?fixed_ips=ip_address%3D{ip}"))
        .await?;
    let port = &v["ports"][0];
    Ok((
        port["id"].as_str().context("port id")?.to_string(),
        port["security_groups"]
            .as_array()
            .context("groups")?
            .iter()
            .filter_map(|g| g.as_str().map(str::to_string))
            .collect(),
    ))
}

async fn uid(env: &Env, name: &str) -> Result<String> {
    env.services.get(name).await?.metadata.uid.context("uid")
}

/// With `manage-security-groups = true` an `externalTrafficPolicy: Local` Service gets OCCM's
/// group: ingress from the members' subnet to its NodePort and its `healthCheckNodePort`, and
/// nothing else (neutron's default egress rules go, as OCCM); it is on node-0's port, and on
/// a second Node's port once that Node joins; deleting the Service takes it off the ports and
/// deletes it.
#[tokio::test]
async fn manage_security_groups_opens_the_node_ports_and_goes_with_the_service() -> Result<()> {
    let env = env_full(
        "lb-sg",
        Setup {
            load_balancer_lines: "manage-security-groups = true\n",
            ..Default::default()
        },
    )
    .await?;
    let mut svc = load_balancer_service("guarded", &[], &[(80, "http")]);
    svc.spec.as_mut().context("spec")?.external_traffic_policy = Some("Local".into());
    env.services.create(&PostParams::default(), &svc).await?;
    env.ingress("guarded").await?;
    let spec = env.services.get("guarded").await?.spec.context("spec")?;
    let node_port = i64::from(spec.ports.context("ports")?[0].node_port.context("node port")?);
    let health = i64::from(spec.health_check_node_port.context("healthCheckNodePort")?);
    let name = format!("lb-sg-{}-default-guarded", uid(&env, "guarded").await?);
    let groups = groups_named(&env, &name).await?;
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(
        groups[0]["description"],
        "Security Group for default/guarded Service LoadBalancer in cluster kubernetes"
    );
    let group = groups[0]["id"].as_str().context("id")?.to_string();
    let want: BTreeSet<_> = [node_port, health]
        .into_iter()
        .map(|p| {
            (
                "ingress".to_string(),
                "tcp".to_string(),
                "10.2.0.0/24".to_string(),
                p,
            )
        })
        .collect();
    assert_eq!(rules_of(&env, &group).await?, want);
    let (port0, groups0) = port_of_node(&env, "node-0").await?;
    assert!(groups0.contains(&group), "on node-0's port: {groups0:?}");

    // A second member Node: its port gets the group too.
    env.project.server("node-1", &env.private).await?;
    let nodes: Api<Node> = Api::all(env.client.clone());
    nodes
        .create(&PostParams::default(), &tainted_node("node-1"))
        .await?;
    wait_for("node-1 initialised", T, || initialised(&nodes, "node-1")).await?;
    wait_for("node-1's port has the group", T, || async {
        let (_, g) = port_of_node(&env, "node-1").await.ok()?;
        g.contains(&group).then_some(())
    })
    .await?;

    env.delete_service("guarded").await?;
    assert!(
        groups_named(&env, &name).await?.is_empty(),
        "deleted with the Service"
    );
    let (again, groups0) = port_of_node(&env, "node-0").await?;
    assert_eq!(again, port0);
    assert!(!groups0.contains(&group), "taken off node-0's port: {groups0:?}");
    Ok(())
}

/// Moving from OCCM with `manage-security-groups` left off: OCCM's group for a Service (its
/// name, description, rule, and on node-0's port) is kept with zero writes to it or the ports
/// (OCCM would take it off the ports on this sync, cutting the load balancer off where the
/// Nodes' own groups do not open the NodePorts), with a warning. When the Service leaks (a CCM
/// stopped, its finalizer removed by hand), `orphans` lists its group — never a group of
/// another cluster — and `--delete` takes it off the port and deletes it.
#[tokio::test]
async fn an_occm_security_group_is_kept_with_the_option_off_and_orphans_find_it_leaked() -> Result<()> {
    let mut env = env("lb-sg-occm").await?;
    let mut svc = load_balancer_service("legacy", &[], &[(80, "http")]);
    svc.spec.as_mut().context("spec")?.type_ = Some("NodePort".into());
    env.services.create(&PostParams::default(), &svc).await?;
    let node_port = env.node_port("legacy").await?;
    let uid = uid(&env, "legacy").await?;
    let s = &env.project.session;
    // OCCM's group, and one of another cluster's for a Service of the same name.
    let mut made = Vec::new();
    for (name, cluster) in [
        (format!("lb-sg-{uid}-default-legacy"), "kubernetes"),
        (
            "lb-sg-00000000-0000-4000-8000-000000000000-default-legacy".to_string(),
            "other",
        ),
    ] {
        let g = s
            .post(
                &format!("{NEUTRON}/security-groups"),
                json!({"security_group": {"name": name,
                       "description": format!("Security Group for default/legacy Service LoadBalancer in cluster {cluster}")}}),
            )
            .await?;
        made.push(g["security_group"]["id"].as_str().context("id")?.to_string());
    }
    let group = made[0].clone();
    s.post(
        &format!("{NEUTRON}/security-group-rules"),
        json!({"security_group_rule": {"security_group_id": group, "direction": "ingress", "protocol": "tcp",
               "ethertype": "IPv4", "remote_ip_prefix": "10.2.0.0/24", "port_range_min": node_port, "port_range_max": node_port}}),
    )
    .await?;
    let (port0, mut groups0) = port_of_node(&env, "node-0").await?;
    groups0.push(group.clone());
    s.put(
        &format!("{NEUTRON}/ports/{port0}"),
        json!({"port": {"security_groups": groups0}}),
    )
    .await?;

    env.project.neutron_proxy.reset_counts();
    env.services
        .patch(
            "legacy",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "LoadBalancer"}})),
        )
        .await?;
    env.ingress("legacy").await?;
    env.sync_again("legacy").await?;
    let group_writes: Vec<String> = env
        .project
        .neutron_proxy
        .counts_by_method()
        .into_keys()
        .filter(|k| !k.starts_with("GET ") && (k.contains("security-group") || k.contains("/ports")))
        .collect();
    assert!(
        group_writes.is_empty(),
        "no write to the group or the ports: {group_writes:?}"
    );
    let (_, groups0) = port_of_node(&env, "node-0").await?;
    assert!(groups0.contains(&group), "still on node-0's port");
    assert!(
        env.ccm
            .log()
            .contains("manage-security-groups = true, which is off"),
        "a warning says why it is kept"
    );

    // The Service leaks.
    env.ccm.signal(nix::sys::signal::Signal::SIGTERM)?;
    env.ccm.wait_exit(std::time::Duration::from_secs(30))?;
    env.services
        .patch(
            "legacy",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    env.services.delete("legacy", &DeleteParams::default()).await?;
    wait_for("legacy deleted", T, || async {
        env.services.get_opt("legacy").await.ok()?.is_none().then_some(())
    })
    .await?;
    let (code, out) = crate::openstack_lb::safety::orphans(&env, "lb-sg-occm", &[]).await?;
    assert_eq!(code, 0, "{out}");
    let groups: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("security-group\t"))
        .collect();
    assert_eq!(groups.len(), 1, "OCCM's, not the other cluster's: {out}");
    assert!(groups[0].contains(&group), "{out}");

    let (code, out) =
        crate::openstack_lb::safety::orphans(&env, "lb-sg-occm", &["--delete", "--yes"]).await?;
    assert_eq!(code, 0, "{out}");
    let name = format!("lb-sg-{uid}-default-legacy");
    assert!(groups_named(&env, &name).await?.is_empty(), "deleted");
    let (_, groups0) = port_of_node(&env, "node-0").await?;
    assert!(
        !groups0.contains(&group),
        "taken off node-0's port first: {groups0:?}"
    );
    assert_eq!(
        groups_named(&env, "lb-sg-00000000-0000-4000-8000-000000000000-default-legacy")
            .await?
            .len(),
        1,
        "the other cluster's group is kept"
    );
    Ok(())
}
