//! `cloud-controller-manager-openstack` as a real process against a real kube-apiserver and a
//! real OpenStack (keystone, nova with the fake virt driver, neutron, octavia with no-op
//! drivers: `hack/openstack.sh`).

use std::{collections::BTreeSet, time::Duration};

use anyhow::Result;
use k8s_cloud_provider::{
    node::helpers::{addresses, has_taint},
    well_known::TAINT_SHUTDOWN,
};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Service};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use rcp_e2e::{
    TestCluster,
    fault_proxy::{Action, FaultApi, FaultKind, RandomFaults, Rule},
    k8s::{ingress_ip, initialised, load_balancer_service, set_ready, tainted_node, wait_for},
    openstack::{FLAVOR, OpenStack, Project, SPACED_FLAVOR, start_ccm, start_ccm_with_env},
};
use serde_json::Value;

const T: Duration = Duration::from_secs(90);

fn label(n: &Node, key: &str) -> Option<String> {
    n.metadata.labels.as_ref()?.get(key).cloned()
}

#[tokio::test]
async fn nodes_come_from_nova_servers_stopped_ones_taint_deleted_ones_delete_and_an_unreachable_nova_deletes_nothing()
-> Result<()> {
    let os = OpenStack::shared().await?;
    // The API server starts while the project is made.
    let (cluster, mut project) = tokio::try_join!(TestCluster::start(), os.project("nodes"))?;
    let net = project.network("private", "10.0.0.0/24").await?;
    let ids = project.servers("node", 4, &net).await?;
    let ccm = start_ccm(
        &cluster,
        &format!("{}[LoadBalancer]\nenabled = false\n", project.global_section()),
        "ccm-openstack-nodes",
        &["--node-monitor-period=1s"],
    )?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    for i in 0..4 {
        nodes
            .create(&PostParams::default(), &tainted_node(&format!("node-{i}")))
            .await?;
    }
    for (i, id) in ids.iter().enumerate() {
        let name = format!("node-{i}");
        let n = wait_for(&format!("{name} initialised"), T, || initialised(&nodes, &name)).await?;
        assert_eq!(
            n.spec.as_ref().and_then(|s| s.provider_id.clone()),
            Some(format!("openstack:///{id}")),
            "{name}"
        );
        let ip = project.server_ip(id, "private").await?;
        let got: Vec<(String, String)> = addresses(&n)
            .iter()
            .map(|a| (a.type_.clone(), a.address.clone()))
            .collect();
        assert_eq!(got, [("InternalIP".to_string(), ip)], "{name}");
        assert_eq!(
            label(&n, "node.kubernetes.io/instance-type").as_deref(),
            Some(FLAVOR)
        );
        assert_eq!(label(&n, "topology.kubernetes.io/zone").as_deref(), Some("nova"));
        assert_eq!(
            label(&n, "topology.kubernetes.io/region").as_deref(),
            Some(project.region.as_str())
        );
        set_ready(&nodes, &name, "True").await?;
    }

    // A flavor whose name is no valid label value: the instance type is its ID (as OCCM), and
    // the Node is initialised.
    let spaced = project
        .server_with_flavor("node-spaced", &net, SPACED_FLAVOR.0)
        .await?;
    nodes
        .create(&PostParams::default(), &tainted_node("node-spaced"))
        .await?;
    let n = wait_for("node-spaced initialised", T, || {
        initialised(&nodes, "node-spaced")
    })
    .await?;
    assert_eq!(
        n.spec.as_ref().and_then(|s| s.provider_id.clone()),
        Some(format!("openstack:///{spaced}"))
    );
    assert_eq!(
        label(&n, "node.kubernetes.io/instance-type").as_deref(),
        Some(SPACED_FLAVOR.0)
    );
    set_ready(&nodes, "node-spaced", "True").await?;

    // One token served every call so far; revoked (keystone revokes a user's tokens when the
    // user is disabled), the next call re-authenticates once and goes on.
    let auths = "cloudprovider_openstack_keystone_authentications_total";
    assert_eq!(ccm.metric_value(auths).await, 1.0, "one token for every call");
    assert!(
        ccm.metric_value("cloudprovider_openstack_api_requests_total")
            .await
            >= 3.0
    );
    project.revoke_tokens().await?;
    set_ready(&nodes, "node-0", "Unknown").await?;
    wait_for("a re-authentication after the token was revoked", T, || async {
        (ccm.metric_value_read(auths).await.ok()? >= 2.0).then_some(())
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        nodes.get_opt("node-0").await?.is_some(),
        "node-0 deleted after the token was revoked"
    );
    // Usually exactly one more; one more again when keystone refused the re-enabled user for a
    // moment or revoked, at its one-second resolution, the token issued right after the
    // revocation (seen on a loaded machine). Then the new token serves every call: no loop.
    let settled = ccm.metric_value_read(auths).await?;
    assert!(
        (2.0..=3.0).contains(&settled),
        "authentications after the revocation: {settled}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        ccm.metric_value_read(auths).await?,
        settled,
        "the new token serves every call: no more authentications"
    );

    // node-3's server is stopped (SHUTOFF): the Node gets the shutdown taint and stays.
    project.stop_server(&ids[3]).await?;
    set_ready(&nodes, "node-3", "False").await?;
    wait_for("shutdown taint on node-3", T, || async {
        has_taint(&nodes.get("node-3").await.ok()?, TAINT_SHUTDOWN).then_some(())
    })
    .await?;
    assert!(
        nodes.get_opt("node-3").await?.is_some(),
        "a stopped server's Node was deleted"
    );

    // The server of node-1 is deleted in nova: the Node goes.
    project.delete_server(&ids[1]).await?;
    set_ready(&nodes, "node-1", "Unknown").await?;
    wait_for("node-1 deleted", T, || async {
        nodes.get_opt("node-1").await.ok()?.is_none().then_some(())
    })
    .await?;

    // nova unreachable (every compute request dropped), and node-2's server deleted meanwhile:
    // nothing may be deleted while nova cannot answer.
    project.nova_proxy.add(Rule::new(&["/"], Action::Drop));
    project.delete_server(&ids[2]).await?;
    set_ready(&nodes, "node-0", "Unknown").await?;
    set_ready(&nodes, "node-2", "Unknown").await?;
    let before = project.nova_proxy.faulted();
    wait_for("the lifecycle controller to hit the dropped nova", T, || async {
        (project.nova_proxy.faulted() >= before + 3).then_some(())
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        nodes.get_opt("node-0").await?.is_some(),
        "node-0 deleted while nova was unreachable"
    );
    assert!(
        nodes.get_opt("node-2").await?.is_some(),
        "node-2 deleted while nova was unreachable"
    );

    // nova back: node-2 (server gone) goes, node-0 (server there) stays.
    project.nova_proxy.clear();
    wait_for("node-2 deleted once nova answers", T, || async {
        nodes.get_opt("node-2").await.ok()?.is_none().then_some(())
    })
    .await?;
    assert!(
        nodes.get_opt("node-0").await?.is_some(),
        "node-0 deleted although its server exists"
    );
    assert!(
        !ccm.log().contains(&project.password),
        "the OpenStack password appears in the log"
    );
    Ok(())
}

async fn members(project: &Project, lb_name: &str) -> Option<BTreeSet<(String, String, i64)>> {
    let lb = project.load_balancers(lb_name).await.ok()?.into_iter().next()?;
    if lb["provisioning_status"] != "ACTIVE" {
        return None;
    }
    let lb_id = lb["id"].as_str()?.to_string();
    let pools = project
        .octavia_list(&format!("pools?loadbalancer_id={lb_id}"), "pools")
        .await
        .ok()?;
    let pool = pools.first()?["id"].as_str()?.to_string();
    let m = project
        .octavia_list(&format!("pools/{pool}/members"), "members")
        .await
        .ok()?;
    Some(
        m.iter()
            .map(|m| {
                (
                    m["name"].as_str().unwrap_or_default().to_string(),
                    m["address"].as_str().unwrap_or_default().to_string(),
                    m["protocol_port"].as_i64().unwrap_or_default(),
                )
            })
            .collect(),
    )
}

#[tokio::test]
async fn a_load_balancer_service_becomes_an_octavia_load_balancer_whose_members_follow_the_nodes()
-> Result<()> {
    let os = OpenStack::shared().await?;
    // The API server starts while the project is made.
    let (cluster, project) = tokio::try_join!(TestCluster::start(), os.project("lb"))?;
    let net = project.network("private", "10.1.0.0/24").await?;
    let public = project.external_network("public", "172.24.4.0/24").await?;
    project.router("edge", &public, &net).await?;
    let ids = project.servers("node", 3, &net).await?;
    let config = format!(
        "{}[LoadBalancer]\nsubnet-id = {}\ncreate-monitor = true\nmonitor-delay = 7s\n",
        project.global_section(),
        net.subnet_id
    );
    let ccm = start_ccm(
        &cluster,
        &config,
        "ccm-openstack-lb",
        &["--node-monitor-period=1s"],
    )?;
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..2 {
        nodes
            .create(&PostParams::default(), &tainted_node(&format!("node-{i}")))
            .await?;
    }
    let mut ips = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        ips.push(project.server_ip(id, "private").await?);
        if i < 2 {
            let name = format!("node-{i}");
            wait_for(&format!("{name} initialised"), T, || initialised(&nodes, &name)).await?;
        }
    }

    // An internal LoadBalancer Service: the VIP (a neutron port octavia made on our subnet) in
    // status.
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let mut web = load_balancer_service("web", &[], &[(80, "http")]);
    web.metadata.annotations = Some(
        [(
            "service.beta.kubernetes.io/openstack-internal-load-balancer".to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    services.create(&PostParams::default(), &web).await?;
    let svc = wait_for("web's ingress", T, || async {
        let s = services.get("web").await.ok()?;
        ingress_ip(&s).map(|_| s)
    })
    .await?;
    let vip = ingress_ip(&svc).unwrap_or_default();
    assert!(vip.starts_with("10.1.0."), "VIP {vip} not on the subnet");
    let node_port = i64::from(
        svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0]
            .node_port
            .unwrap(),
    );
    let lb_name = "kube_service_kubernetes_default_web";
    let lbs = project.load_balancers(lb_name).await?;
    assert_eq!(lbs.len(), 1, "{lbs:?}");
    assert_eq!(lbs[0]["vip_address"], vip.as_str());
    let lb_id = lbs[0]["id"].as_str().unwrap().to_string();
    let listeners = project
        .octavia_list(&format!("listeners?loadbalancer_id={lb_id}"), "listeners")
        .await?;
    assert_eq!(listeners.len(), 1);
    assert_eq!(listeners[0]["protocol"], "TCP");
    assert_eq!(listeners[0]["protocol_port"], 80);
    let pools = project
        .octavia_list(&format!("pools?loadbalancer_id={lb_id}"), "pools")
        .await?;
    assert_eq!(pools.len(), 1);
    assert_eq!(pools[0]["lb_algorithm"], "ROUND_ROBIN");
    let monitors = project.octavia_list("healthmonitors", "healthmonitors").await?;
    let monitor = monitors
        .iter()
        .find(|m| {
            m["pools"]
                .as_array()
                .is_some_and(|p| p.iter().any(|p| p["id"] == pools[0]["id"]))
        })
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(monitor["type"], "TCP", "{monitors:?}");
    assert_eq!(monitor["delay"], 7);
    let want = |n: &[usize]| -> BTreeSet<(String, String, i64)> {
        n.iter()
            .map(|i| (format!("node-{i}"), ips[*i].clone(), node_port))
            .collect()
    };
    wait_for("members node-0, node-1", T, || async {
        members(&project, lb_name).await.filter(|m| *m == want(&[0, 1]))
    })
    .await
    .inspect_err(|_| eprintln!("{}", ccm.log()))?;

    // A Node joins: a member is added; a Node leaves: its member goes.
    nodes
        .create(&PostParams::default(), &tainted_node("node-2"))
        .await?;
    wait_for("node-2 initialised", T, || initialised(&nodes, "node-2")).await?;
    wait_for("members node-0..2", T, || async {
        members(&project, lb_name)
            .await
            .filter(|m| *m == want(&[0, 1, 2]))
    })
    .await
    .inspect_err(|_| eprintln!("{}", ccm.log()))?;
    nodes.delete("node-0", &DeleteParams::default()).await?;
    wait_for("members node-1, node-2", T, || async {
        members(&project, lb_name).await.filter(|m| *m == want(&[1, 2]))
    })
    .await
    .inspect_err(|_| eprintln!("{}", ccm.log()))?;

    // An external Service: a floating IP from the external network on the VIP port.
    let mut ext = load_balancer_service("web-ext", &[], &[(443, "https")]);
    ext.metadata.annotations = Some(
        [(
            "loadbalancer.openstack.org/floating-network-id".to_string(),
            public.id.clone(),
        )]
        .into(),
    );
    services.create(&PostParams::default(), &ext).await?;
    let ext = wait_for("web-ext's ingress", T, || async {
        let s = services.get("web-ext").await.ok()?;
        ingress_ip(&s).map(|_| s)
    })
    .await
    .inspect_err(|_| eprintln!("{}", ccm.log()))?;
    let fips = project.floating_ips().await?;
    assert_eq!(fips.len(), 1, "{fips:?}");
    let ext_lb = project
        .load_balancers("kube_service_kubernetes_default_web-ext")
        .await?;
    assert_eq!(fips[0]["port_id"], ext_lb[0]["vip_port_id"]);
    assert_eq!(fips[0]["fixed_ip_address"], ext_lb[0]["vip_address"]);
    assert_eq!(
        ingress_ip(&ext).as_deref(),
        fips[0]["floating_ip_address"].as_str()
    );
    assert!(ingress_ip(&ext).unwrap().starts_with("172.24.4."));

    // Deleted: nothing left in octavia, the floating IP released.
    services.delete("web", &DeleteParams::default()).await?;
    services.delete("web-ext", &DeleteParams::default()).await?;
    wait_for("both load balancers gone from octavia", T, || async {
        let a = project.load_balancers(lb_name).await.ok()?;
        let b = project
            .load_balancers("kube_service_kubernetes_default_web-ext")
            .await
            .ok()?;
        (a.is_empty() && b.is_empty()).then_some(())
    })
    .await?;
    wait_for("Services gone (finalizers removed)", T, || async {
        let web = services.get_opt("web").await.ok()?;
        let ext = services.get_opt("web-ext").await.ok()?;
        (web.is_none() && ext.is_none()).then_some(())
    })
    .await?;
    assert!(
        project.floating_ips().await?.is_empty(),
        "a floating IP was left behind"
    );
    let listeners = project.octavia_list("listeners", "listeners").await?;
    assert!(listeners.is_empty(), "listeners left: {listeners:?}");
    let pools = project.octavia_list("pools", "pools").await?;
    assert!(pools.is_empty(), "pools left: {pools:?}");
    assert!(!ccm.log().contains(&project.password));
    Ok(())
}

#[tokio::test]
async fn pod_routes_go_on_the_neutron_router_with_address_pairs_and_leave_with_the_node() -> Result<()> {
    let os = OpenStack::shared().await?;
    // The API server starts while the project is made.
    let (cluster, project) = tokio::try_join!(TestCluster::start(), os.project("routes"))?;
    let net = project.network("private", "10.2.0.0/24").await?;
    let public = project.external_network("public", "172.25.4.0/24").await?;
    let router = project.router("edge", &public, &net).await?;
    let ids = project.servers("node", 3, &net).await?;
    // node-2's port has port security off: neutron refuses address pairs on it (and needs none).
    let node_2_port = project
        .session
        .get(&format!(
            "{}/ports?device_id={}",
            rcp_e2e::openstack::NEUTRON,
            ids[2]
        ))
        .await?["ports"][0]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    project
        .session
        .put(
            &format!("{}/ports/{node_2_port}", rcp_e2e::openstack::NEUTRON),
            serde_json::json!({"port": {"port_security_enabled": false, "security_groups": []}}),
        )
        .await?;
    let config = format!(
        "{}[LoadBalancer]\nenabled = false\n[Route]\nrouter-id = {router}\n",
        project.global_section()
    );
    let _ccm = start_ccm(
        &cluster,
        &config,
        "ccm-openstack-routes",
        &[
            "--controllers=*,route",
            "--configure-cloud-routes=true",
            "--cluster-cidr=10.244.0.0/16",
            "--route-reconciliation-period=1s",
        ],
    )?;
    let nodes_client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(nodes_client.clone());
    let mut ips = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        ips.push(project.server_ip(id, "private").await?);
        let mut n = tainted_node(&format!("node-{i}"));
        let cidr = format!("10.244.{}.0/24", i + 1);
        n.spec = Some(NodeSpec {
            pod_cidr: Some(cidr.clone()),
            pod_cidrs: Some(vec![cidr]),
            ..n.spec.unwrap()
        });
        nodes.create(&PostParams::default(), &n).await?;
    }
    let routes = || async {
        let r = project.router_routes(&router).await.ok()?;
        Some(
            r.iter()
                .map(|r| {
                    (
                        r["destination"].as_str().unwrap_or_default().to_string(),
                        r["nexthop"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect::<BTreeSet<_>>(),
        )
    };
    let want: BTreeSet<(String, String)> = (0..3)
        .map(|i| (format!("10.244.{}.0/24", i + 1), ips[i].clone()))
        .collect();
    wait_for("three router routes", T, || async {
        routes().await.filter(|r| *r == want)
    })
    .await?;
    for (i, id) in ids.iter().enumerate().take(2) {
        let want = vec![format!("10.244.{}.0/24", i + 1)];
        wait_for(
            &format!("node-{i}'s pod CIDR in its port's allowed address pairs"),
            T,
            || async { project.address_pairs(id).await.ok().filter(|p| *p == want) },
        )
        .await?;
    }
    // A route someone else put on the router (outside the cluster CIDR) stays.
    project
        .session
        .put(
            &format!("{}/routers/{router}/add_extraroutes", rcp_e2e::openstack::NEUTRON),
            serde_json::json!({"router": {"routes": [{"destination": "192.168.50.0/24", "nexthop": ips[0]}]}}),
        )
        .await?;
    assert!(
        project.address_pairs(&ids[2]).await?.is_empty(),
        "no address pair on a port without port security"
    );
    // And its route counts as made: the Node's network is available.
    wait_for("node-2's NetworkUnavailable=False", T, || async {
        let n = nodes.get("node-2").await.ok()?;
        n.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "NetworkUnavailable" && c.status == "False")
            .then_some(())
    })
    .await?;
    // Without a failed attempt first (neutron refuses address pairs on such a port: a
    // `FailedToCreateRoute` Warning would say so; events are written within a second).
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let failures: Vec<_> = rcp_e2e::k8s::events_for(&nodes_client, "default", "node-2")
        .await?
        .into_iter()
        .filter(|(reason, _, _)| reason == "FailedToCreateRoute")
        .collect();
    assert!(failures.is_empty(), "{failures:?}");
    nodes.delete("node-1", &DeleteParams::default()).await?;
    let mut want_after: BTreeSet<(String, String)> = [
        ("10.244.1.0/24".to_string(), ips[0].clone()),
        ("10.244.3.0/24".to_string(), ips[2].clone()),
    ]
    .into();
    want_after.insert(("192.168.50.0/24".to_string(), ips[0].clone()));
    wait_for("node-1's route removed", T, || async {
        routes().await.filter(|r| *r == want_after)
    })
    .await?;
    wait_for("node-1's address pair removed", T, || async {
        project
            .address_pairs(&ids[1])
            .await
            .ok()?
            .is_empty()
            .then_some(())
    })
    .await?;
    Ok(())
}

/// nova, neutron and octavia answering a share (`RCP_FAULT_SHARE`, default 20 %) of the
/// requests with 429/500/503 errors, resets, 0.5–2 s delays or lost answers (the operation
/// happened, the answer says 500): every Node is initialised, a load-balancer Service gets one
/// load balancer (never a second: a lost answer to a create is found again by name) with
/// its members; while the faults go on no Node is deleted or tainted though the lifecycle
/// controller keeps checking; once they stop, the deleted Service leaves nothing in octavia.
#[tokio::test]
async fn nodes_and_a_load_balancer_converge_under_random_openstack_faults() -> Result<()> {
    const N: usize = 3;
    let share: f64 = std::env::var("RCP_FAULT_SHARE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.2);
    let os = OpenStack::shared().await?;
    // The API server starts while the project is made.
    let (cluster, project) = tokio::try_join!(TestCluster::start(), os.project("faults"))?;
    let net = project.network("private", "10.2.0.0/24").await?;
    let ids = project.servers("node", N, &net).await?;
    let config = format!(
        // No router in this project: internal load balancers (an external network detected
        // among other projects' would not be reachable from the subnet).
        "{}[LoadBalancer]\nsubnet-id = {}\ninternal-lb = true\n",
        project.global_section(),
        net.subnet_id
    );
    let ccm = start_ccm(
        &cluster,
        &config,
        "ccm-openstack-faults",
        &["--node-monitor-period=1s"],
    )?;
    let proxies = [
        &project.nova_proxy,
        &project.neutron_proxy,
        &project.octavia_proxy,
    ];
    for p in proxies {
        p.set_random_faults(Some(RandomFaults {
            share,
            kinds: FaultKind::ALL.to_vec(),
            only: vec![],
            api: FaultApi::OpenStack,
        }));
    }
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client, "default");
    let start = std::time::Instant::now();
    for i in 0..N {
        nodes
            .create(&PostParams::default(), &tainted_node(&format!("node-{i}")))
            .await?;
    }
    services
        .create(
            &PostParams::default(),
            &load_balancer_service("web", &[], &[(80, "http")]),
        )
        .await?;
    let mut ips = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        ips.push(project.server_ip(id, "private").await?);
        let name = format!("node-{i}");
        wait_for(&format!("{name} initialised"), T * 2, || {
            initialised(&nodes, &name)
        })
        .await
        .inspect_err(|_| eprintln!("{}", ccm.log()))?;
    }
    let lb_name = "kube_service_kubernetes_default_web";
    let svc = wait_for("web's ingress", T * 2, || async {
        let s = services.get("web").await.ok()?;
        ingress_ip(&s).map(|_| s)
    })
    .await
    .inspect_err(|_| eprintln!("{}", ccm.log()))?;
    let node_port = i64::from(
        svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0]
            .node_port
            .unwrap(),
    );
    let want: BTreeSet<(String, String, i64)> = (0..N)
        .map(|i| (format!("node-{i}"), ips[i].clone(), node_port))
        .collect();
    wait_for("a member per Node", T * 2, || async {
        members(&project, lb_name).await.filter(|m| *m == want)
    })
    .await
    .inspect_err(|_| eprintln!("{}", ccm.log()))?;
    let converged = start.elapsed();
    let lbs = project.load_balancers(lb_name).await?;
    assert_eq!(lbs.len(), 1, "one load balancer for the Service: {lbs:?}");

    // Faults go on: no Node deleted or tainted while the lifecycle controller checks them.
    let lifecycle = [
        "controller_reconcile_total{",
        "controller=\"cloud-node-lifecycle-controller\"",
    ];
    let before = ccm.metric_sum(&lifecycle).await;
    for i in 0..N {
        set_ready(&nodes, &format!("node-{i}"), "Unknown").await?;
    }
    // At least 15 s, and until the lifecycle controller has made two passes (on a busy machine
    // a pass under 20 % faults with delays can take longer than 15 s), at most 120 s.
    let watch_start = std::time::Instant::now();
    loop {
        let elapsed = watch_start.elapsed();
        let passes = ccm.metric_sum(&lifecycle).await - before;
        if elapsed > Duration::from_secs(120) || (elapsed >= Duration::from_secs(15) && passes >= 2.0) {
            break;
        }
        for i in 0..N {
            let n = nodes.get_opt(&format!("node-{i}")).await?;
            let n = n.unwrap_or_else(|| panic!("node-{i} deleted while its server exists"));
            assert!(
                !has_taint(&n, TAINT_SHUTDOWN),
                "node-{i} tainted as shut down while its server runs"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let watched = watch_start.elapsed();
    let checked = ccm.metric_sum(&lifecycle).await - before;
    let (requests, faulted): (usize, usize) = (
        proxies.iter().map(|p| p.total()).sum(),
        proxies.iter().map(|p| p.faulted()).sum(),
    );
    let mut by_kind = std::collections::BTreeMap::<String, usize>::new();
    for p in proxies {
        for (k, n) in p.faulted_by_kind() {
            *by_kind.entry(k).or_default() += n;
        }
        p.set_random_faults(None);
    }

    services.delete("web", &DeleteParams::default()).await?;
    wait_for("the load balancer gone from octavia", T * 2, || async {
        project
            .load_balancers(lb_name)
            .await
            .ok()?
            .is_empty()
            .then_some(())
    })
    .await
    .inspect_err(|_| eprintln!("{}", ccm.log()))?;
    wait_for("web gone (finalizer removed)", T, || async {
        services.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await?;
    println!(
        "OpenStack with {:.0} % faults: {N} Nodes initialised and a load balancer with its members in {converged:.1?}; {requests} requests, {faulted} faulted ({by_kind:?}); {checked} lifecycle passes in {:.0?}, none deleted or tainted; {:.1} requests per lifecycle pass or initialisation",
        share * 100.0,
        watched,
        requests as f64 / (checked + N as f64).max(1.0),
    );
    // Proof that the lifecycle controller kept checking while the faults went on (how long two
    // passes take depends on the machine: a figure, printed above, bounded at 120 s).
    assert!(
        checked >= 2.0,
        "the lifecycle controller kept checking ({checked} passes)"
    );
    assert!(share == 0.0 || faulted > 0, "faults were injected");
    assert!(!ccm.log().contains(&project.password));
    Ok(())
}

/// `[Metadata] request-timeout` bounds every API request, as in OCCM: while nova hangs on
/// server lookups, the CCM gives each up after 2 s (`request-timeout = 2s`) and asks again —
/// several requests within 20 s, where the 60 s default would have left the first one
/// waiting — each failure saying which setting bounded it; once nova answers the Node is
/// initialised.
#[tokio::test]
async fn request_timeout_bounds_every_openstack_request() -> Result<()> {
    let os = OpenStack::shared().await?;
    let (cluster, project) = tokio::try_join!(TestCluster::start(), os.project("timeout"))?;
    let net = project.network("private", "10.3.0.0/24").await?;
    project.server("node-0", &net).await?;
    project
        .nova_proxy
        .add(Rule::new(&["/servers/detail"], Action::Hang));
    let ccm = start_ccm(
        &cluster,
        &format!(
            "{}[LoadBalancer]\nenabled = false\n[Metadata]\nrequest-timeout = 2s\n",
            project.global_section()
        ),
        "ccm-openstack-timeout",
        &[],
    )?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    nodes
        .create(&PostParams::default(), &tainted_node("node-0"))
        .await?;
    // The node controller's error once its lookup (sent 3 times) was given up each time.
    wait_for(
        "an error saying the request timeout gave the server lookup up",
        Duration::from_secs(20),
        || async {
            ccm.log()
                .contains("no answer within the request timeout ([Metadata] request-timeout")
                .then_some(())
        },
    )
    .await
    .inspect_err(|_| eprintln!("{}", ccm.log()))?;
    assert!(
        project.nova_proxy.faulted() >= 3,
        "each attempt hung and was given up"
    );
    project.nova_proxy.clear();
    wait_for("node-0 initialised", T, || initialised(&nodes, "node-0")).await?;
    Ok(())
}

/// With OCCM's `OS_CCM_REGIONAL=true` a Node's provider ID names the region
/// (`openstack://<region>/<server-id>`), and the lifecycle reads it back: the Node is
/// initialised, then deleted once its server is.
#[tokio::test]
async fn os_ccm_regional_gives_regional_provider_ids() -> Result<()> {
    let os = OpenStack::shared().await?;
    let (cluster, project) = tokio::try_join!(TestCluster::start(), os.project("regional"))?;
    let net = project.network("private", "10.5.0.0/24").await?;
    let id = project.server("node-0", &net).await?;
    let _ccm = start_ccm_with_env(
        &cluster,
        &format!("{}[LoadBalancer]\nenabled = false\n", project.global_section()),
        "ccm-openstack-regional",
        &["--node-monitor-period=1s"],
        &[("OS_CCM_REGIONAL", "true")],
    )?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    nodes
        .create(&PostParams::default(), &tainted_node("node-0"))
        .await?;
    let n = wait_for("node-0 initialised", T, || initialised(&nodes, "node-0")).await?;
    assert_eq!(
        n.spec.as_ref().and_then(|s| s.provider_id.clone()),
        Some(format!("openstack://{}/{id}", project.region))
    );
    set_ready(&nodes, "node-0", "False").await?;
    project.delete_server(&id).await?;
    wait_for("node-0 deleted with its server", T, || async {
        nodes.get_opt("node-0").await.ok()?.is_none().then_some(())
    })
    .await?;
    Ok(())
}

/// `[Networking]` as OCCM, on a server with a port on three networks: the address on a
/// `public-network-name` network is the ExternalIP, the one on the `internal-network-name`
/// network the InternalIP, a network named by neither gives none; `ipv6-support-disabled`
/// leaves the internal network's IPv6 address out; `address-sort-order` puts the internal
/// subnet first (by network name the `edge` address would come first).
#[tokio::test]
async fn networking_keys_choose_and_order_the_node_addresses() -> Result<()> {
    let os = OpenStack::shared().await?;
    let (cluster, project) = tokio::try_join!(TestCluster::start(), os.project("networking"))?;
    let private = project.network("private", "10.7.0.0/24").await?;
    project
        .session
        .post(
            &format!("{}/subnets", rcp_e2e::openstack::NEUTRON),
            serde_json::json!({"subnet": {"name": "private-v6", "network_id": private.id, "ip_version": 6,
                   "cidr": "fd00:7::/64"}}),
        )
        .await?;
    let edge = project.network("edge", "10.9.0.0/24").await?;
    let other = project.network("other", "10.10.0.0/24").await?;
    let id = project
        .server_on("node-0", &[&private, &edge, &other], FLAVOR)
        .await?;
    let server = project.server_json(&id).await?;
    let v6 = server["addresses"]["private"]
        .as_array()
        .is_some_and(|a| a.iter().any(|a| a["version"] == 6));
    assert!(v6, "the server has an IPv6 address to leave out: {server}");
    let _ccm = start_ccm(
        &cluster,
        &format!(
            "{}[LoadBalancer]\nenabled = false\n[Networking]\npublic-network-name = edge\ninternal-network-name = private\nipv6-support-disabled = true\naddress-sort-order = 10.7.0.0/24\n",
            project.global_section()
        ),
        "ccm-openstack-networking",
        &[],
    )?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    nodes
        .create(&PostParams::default(), &tainted_node("node-0"))
        .await?;
    let n = wait_for("node-0 initialised", T, || initialised(&nodes, "node-0")).await?;
    let got: Vec<(String, String)> = addresses(&n)
        .iter()
        .map(|a| (a.type_.clone(), a.address.clone()))
        .collect();
    let ipv4 = |network: &str| {
        server["addresses"][network]
            .as_array()
            .and_then(|a| a.iter().find(|a| a["version"] == 4))
            .and_then(|a| a["addr"].as_str())
            .map(str::to_string)
            .unwrap_or_default()
    };
    assert_eq!(
        got,
        [
            ("InternalIP".to_string(), ipv4("private")),
            ("ExternalIP".to_string(), ipv4("edge")),
        ]
    );
    Ok(())
}
