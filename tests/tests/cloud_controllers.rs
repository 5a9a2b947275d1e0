//! The four cloud controllers against a real kube-apiserver, with the fake provider.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Result;
use k8s_cloud_provider::{
    Route,
    controllers::{ControllersConfig, node, nodelifecycle, route, service},
    fake::{FakeCloud, FakeError, FakeInstance},
    node::helpers::{addresses, has_taint},
    well_known::{
        ANNOTATION_PROVIDED_NODE_IP, FINALIZER_LOAD_BALANCER_CLEANUP, TAINT_SHUTDOWN, TAINT_UNINITIALIZED,
    },
};
use k8s_openapi::api::core::v1::{Node, NodeAddress, Service, ServicePort, ServiceSpec};
use kube::{
    Api, Client,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use rcp_e2e::{
    TestCluster,
    k8s::{
        events_for, ingress_hostname, initialised, set_ready, start_controllers, tainted_node, wait_for,
        wait_for_event,
    },
};

const T: Duration = Duration::from_secs(30);

fn fake_instance(i: usize) -> FakeInstance {
    FakeInstance::new(&format!("fake://i-{i:04}"))
        .instance_type("m5.large")
        .zone(if i.is_multiple_of(2) { "zone-a" } else { "zone-b" }, "region-1")
        .address("InternalIP", &format!("10.0.{}.{}", i / 250, i % 250 + 1))
        .address("ExternalIP", &format!("54.0.{}.{}", i / 250, i % 250 + 1))
        .address("InternalDNS", &format!("node-{i}.internal"))
}

fn addr(t: &str, a: &str) -> NodeAddress {
    NodeAddress {
        type_: t.into(),
        address: a.into(),
    }
}

#[tokio::test]
async fn tainted_node_is_initialised_with_labels_provider_id_and_addresses() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let client = cluster.client().await?;
    let cloud = Arc::new(FakeCloud::new());
    cloud.add_instance(
        "node-a",
        fake_instance(0)
            .label("example.com/rack", "r7")
            .label("kubernetes.io/evil", "x"),
    );
    let _c = start_controllers(
        client.clone(),
        cloud.clone(),
        ControllersConfig::default(),
        &[node::NAME],
    )
    .await?;

    let nodes: Api<Node> = Api::all(client.clone());
    let mut n = tainted_node("node-a");
    n.metadata.labels = Some([("example.com/rack".to_string(), "existing".to_string())].into());
    nodes.create(&PostParams::default(), &n).await?;
    let n = wait_for("node-a initialised", T, || initialised(&nodes, "node-a")).await?;

    assert_eq!(
        n.spec.as_ref().unwrap().provider_id.as_deref(),
        Some("fake://i-0000")
    );
    let labels = n.metadata.labels.clone().unwrap();
    let expected: BTreeMap<&str, &str> = [
        ("node.kubernetes.io/instance-type", "m5.large"),
        ("beta.kubernetes.io/instance-type", "m5.large"),
        ("topology.kubernetes.io/zone", "zone-a"),
        ("failure-domain.beta.kubernetes.io/zone", "zone-a"),
        ("topology.kubernetes.io/region", "region-1"),
        ("failure-domain.beta.kubernetes.io/region", "region-1"),
        // Additional labels never overwrite and never enter kubernetes.io namespaces.
        ("example.com/rack", "existing"),
    ]
    .into();
    for (k, v) in &expected {
        assert_eq!(labels.get(*k).map(String::as_str), Some(*v), "label {k}");
    }
    assert!(!labels.contains_key("kubernetes.io/evil"));
    assert_eq!(
        addresses(&n),
        &[
            addr("InternalIP", "10.0.0.1"),
            addr("ExternalIP", "54.0.0.1"),
            addr("InternalDNS", "node-0.internal")
        ]
    );
    let taints = n.spec.unwrap().taints.unwrap_or_default();
    // kube-apiserver's TaintNodesByCondition admission adds not-ready to new Nodes.
    assert!(
        taints.iter().all(|t| t.key == "node.kubernetes.io/not-ready"),
        "uninitialized taint removed, nothing added: {taints:?}"
    );

    let events = wait_for("Synced event", T, || async {
        let e = events_for(&client, "default", "node-a").await.ok()?;
        e.into_iter().find(|(reason, _, _)| reason == "Synced")
    })
    .await?;
    assert_eq!(events.1, "Node synced successfully");
    assert_eq!(events.2, "cloud-node-controller");

    // Written as patches of the fields the controller owns, never as a whole Node: whatever
    // this build's types do not know (fields of newer API servers) cannot be dropped.
    let node_writes: Vec<_> = cluster
        .audit_writes()
        .into_iter()
        .filter(|e| e["objectRef"]["resource"] == "nodes" && e["objectRef"]["name"] == "node-a")
        .filter(|e| e["verb"] != "create")
        .collect();
    assert!(
        !node_writes.is_empty(),
        "the audit log shows the controller's writes"
    );
    for e in &node_writes {
        assert_eq!(e["verb"], "patch", "{e}");
        let body = &e["requestObject"];
        let owned = |path: &str, keys: &[&str]| {
            body.pointer(path)
                .and_then(|v| v.as_object())
                .is_none_or(|o| o.keys().all(|k| keys.contains(&k.as_str())))
        };
        match e["objectRef"]["subresource"].as_str() {
            None => {
                assert!(owned("", &["metadata", "spec"]), "{body}");
                assert!(owned("/metadata", &["resourceVersion", "labels"]), "{body}");
                assert!(owned("/spec", &["providerID", "taints"]), "{body}");
            }
            Some("status") => {
                assert!(owned("", &["status"]), "{body}");
                assert!(owned("/status", &["addresses"]), "{body}");
            }
            other => panic!("unexpected write to nodes/{other:?}: {e}"),
        }
    }
    Ok(())
}

#[tokio::test]
async fn provider_error_keeps_the_taint_and_is_retried() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let client = cluster.client().await?;
    let cloud = Arc::new(FakeCloud::new());
    cloud.add_instance("node-e", fake_instance(1));
    cloud.fail(
        "InstanceMetadata",
        FakeError::Other("cloud API unavailable".into()),
    );
    let _c = start_controllers(
        client.clone(),
        cloud.clone(),
        ControllersConfig::default(),
        &[node::NAME],
    )
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &tainted_node("node-e"))
        .await?;

    // Retried with back-off (5 ms, 10 ms, …): several calls, and the taint stays.
    wait_for("retries", T, || async {
        (cloud.calls_starting_with("InstanceMetadata node-e").len() >= 3).then_some(())
    })
    .await?;
    let n = nodes.get("node-e").await?;
    assert!(has_taint(&n, TAINT_UNINITIALIZED));
    assert!(n.spec.as_ref().unwrap().provider_id.is_none());

    cloud.clear_failure("InstanceMetadata");
    let n = wait_for("node-e initialised after the cloud recovers", T, || {
        initialised(&nodes, "node-e")
    })
    .await?;
    assert_eq!(n.spec.unwrap().provider_id.as_deref(), Some("fake://i-0001"));
    Ok(())
}

/// The API server takes the initialising write and then fails every attempt at the Node's
/// addresses (as when it restarts in between): the Node is synced again and gets its addresses
/// well before the next periodic address sync (5 min), which is all that used to bring them.
#[tokio::test]
async fn addresses_lost_after_initialisation_are_written_by_a_retry() -> Result<()> {
    use rcp_e2e::fault_proxy::{Action, FaultProxy, Rule};
    let cluster = TestCluster::start().await?;
    let client = cluster.client().await?;
    let proxy = FaultProxy::start_tls_self_signed(cluster.server()).await?;
    let proxied =
        rcp_e2e::cluster::client_from_kubeconfig(&cluster.kubeconfig_via_proxy(proxy.port())?).await?;
    // Every attempt of the first sync (5) fails, and a few more of its retries.
    let failures = 8;
    proxy.add(
        Rule::new(
            &["/api/v1/nodes/node-f/status"],
            // No answer, as from an API server that is going down (a 503 would also be tried
            // again by the client library itself).
            Action::Drop,
        )
        .times(failures),
    );
    let cloud = Arc::new(FakeCloud::new());
    cloud.add_instance("node-f", fake_instance(2));
    let _c = start_controllers(
        proxied,
        cloud.clone(),
        ControllersConfig::default(),
        &[node::NAME],
    )
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &tainted_node("node-f"))
        .await?;
    let n = wait_for("node-f initialised with its addresses", T, || {
        initialised(&nodes, "node-f")
    })
    .await?;
    assert_eq!(
        n.spec.as_ref().unwrap().provider_id.as_deref(),
        Some("fake://i-0002")
    );
    assert_eq!(addresses(&n)[0], addr("InternalIP", "10.0.0.3"));
    let patched = proxy
        .counts_by_method()
        .get("PATCH /api/v1/nodes/node-f/status")
        .copied()
        .unwrap_or_default();
    assert!(
        patched > failures,
        "the addresses came from a write after the {failures} failed ones: {patched} PATCHes"
    );
    Ok(())
}

#[tokio::test]
async fn provided_node_ip_orders_addresses_and_a_wrong_one_blocks_initialisation() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let client = cluster.client().await?;
    let cloud = Arc::new(FakeCloud::new());
    cloud.add_instance(
        "node-ip",
        FakeInstance::new("fake://i-ip")
            .address("InternalIP", "10.0.0.1")
            .address("InternalIP", "10.0.0.2")
            .address("ExternalIP", "54.0.0.9"),
    );
    cloud.add_instance(
        "node-bad-ip",
        FakeInstance::new("fake://i-bad").address("InternalIP", "10.0.1.1"),
    );
    let _c = start_controllers(
        client.clone(),
        cloud.clone(),
        ControllersConfig::default(),
        &[node::NAME],
    )
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for (name, ip) in [("node-ip", "10.0.0.2"), ("node-bad-ip", "10.9.9.9")] {
        let mut n = tainted_node(name);
        n.metadata.annotations = Some([(ANNOTATION_PROVIDED_NODE_IP.to_string(), ip.to_string())].into());
        nodes.create(&PostParams::default(), &n).await?;
    }
    let n = wait_for("node-ip initialised", T, || initialised(&nodes, "node-ip")).await?;
    // The provided IP first; the other InternalIP dropped; other types kept.
    assert_eq!(
        addresses(&n),
        &[addr("InternalIP", "10.0.0.2"), addr("ExternalIP", "54.0.0.9")]
    );

    wait_for("node-bad-ip retried", T, || async {
        (cloud.calls_starting_with("InstanceMetadata node-bad-ip").len() >= 2).then_some(())
    })
    .await?;
    let bad = nodes.get("node-bad-ip").await?;
    assert!(
        has_taint(&bad, TAINT_UNINITIALIZED),
        "a provided IP the cloud does not know keeps the node tainted"
    );
    Ok(())
}

#[tokio::test]
async fn two_hundred_tainted_nodes_are_all_initialised() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let client = cluster.client().await?;
    let cloud = Arc::new(FakeCloud::new());
    for i in 0..200 {
        cloud.add_instance(&format!("burst-{i:03}"), fake_instance(i));
    }
    let config = ControllersConfig {
        concurrent_node_syncs: 10,
        ..Default::default()
    };
    let _c = start_controllers(client.clone(), cloud.clone(), config, &[node::NAME]).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let start = Instant::now();
    futures::future::try_join_all((0..200).map(|i| {
        let nodes = nodes.clone();
        async move {
            nodes
                .create(&PostParams::default(), &tainted_node(&format!("burst-{i:03}")))
                .await
        }
    }))
    .await?;
    let created = start.elapsed();
    wait_for("200 nodes initialised", Duration::from_secs(120), || async {
        let list = nodes.list(&Default::default()).await.ok()?;
        let done = list
            .items
            .iter()
            .filter(|n| !has_taint(n, TAINT_UNINITIALIZED) && !addresses(n).is_empty())
            .count();
        (done == 200).then_some(())
    })
    .await?;
    println!(
        "200-node initialisation (fake cloud, unthrottled client, --concurrent-node-syncs=10): created in {:.2?}, all initialised {:.2?} after the first create; {} InstanceMetadata calls",
        created,
        start.elapsed(),
        cloud.calls_starting_with("InstanceMetadata").len()
    );
    Ok(())
}

async fn create_initialised(nodes: &Api<Node>, name: &str, pid: &str) -> Result<()> {
    let mut n = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
        provider_id: Some(pid.into()),
        ..Default::default()
    });
    nodes.create(&PostParams::default(), &n).await?;
    Ok(())
}

#[tokio::test]
async fn lifecycle_deletes_gone_nodes_taints_shut_down_ones_and_never_acts_on_errors() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let client = cluster.client().await?;
    let cloud = Arc::new(FakeCloud::new());
    for (i, name) in ["gone", "stopped", "erroring", "ready"].iter().enumerate() {
        cloud.add_instance(name, FakeInstance::new(&format!("fake://i-{i}")));
    }
    let nodes: Api<Node> = Api::all(client.clone());
    for (i, name) in ["gone", "stopped", "erroring", "ready"].iter().enumerate() {
        create_initialised(&nodes, name, &format!("fake://i-{i}")).await?;
        set_ready(&nodes, name, if *name == "ready" { "True" } else { "False" }).await?;
    }
    cloud.remove_instance("gone");
    cloud.remove_instance("ready"); // Ready nodes are never checked against the cloud.
    cloud.set_shutdown("stopped", true);
    let config = ControllersConfig {
        node_monitor_period: Duration::from_millis(200),
        ..Default::default()
    };
    let _c = start_controllers(client.clone(), cloud.clone(), config, &[nodelifecycle::NAME]).await?;

    wait_for("gone deleted", T, || async {
        nodes.get_opt("gone").await.ok()?.is_none().then_some(())
    })
    .await?;
    let ev = wait_for("DeletingNode event", T, || async {
        events_for(&client, "default", "gone")
            .await
            .ok()?
            .into_iter()
            .find(|e| e.0 == "DeletingNode")
    })
    .await?;
    assert_eq!(
        ev.1,
        "Deleting node gone because it does not exist in the cloud provider"
    );
    assert_eq!(ev.2, "cloud-node-lifecycle-controller");

    wait_for("stopped tainted", T, || async {
        let n = nodes.get("stopped").await.ok()?;
        has_taint(&n, TAINT_SHUTDOWN).then_some(())
    })
    .await?;
    // It comes back: Ready again → the shutdown taint goes.
    cloud.set_shutdown("stopped", false);
    set_ready(&nodes, "stopped", "True").await?;
    wait_for("stopped untainted", T, || async {
        let n = nodes.get("stopped").await.ok()?;
        (!has_taint(&n, TAINT_SHUTDOWN)).then_some(())
    })
    .await?;

    // A cloud that errors deletes nothing, even for a node whose instance is gone.
    cloud.fail("InstanceExists", FakeError::Other("credentials rejected".into()));
    cloud.remove_instance("erroring");
    let before = cloud.calls_starting_with("InstanceExists erroring").len();
    wait_for("several checks of erroring", T, || async {
        (cloud.calls_starting_with("InstanceExists erroring").len() >= before + 3).then_some(())
    })
    .await?;
    assert!(
        nodes.get_opt("erroring").await?.is_some(),
        "a cloud error must never delete a node"
    );
    assert!(
        nodes.get_opt("ready").await?.is_some(),
        "a Ready node is never deleted"
    );
    assert!(cloud.calls_starting_with("InstanceExists ready").is_empty());
    Ok(())
}

fn lb_service(name: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                port: 80,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

async fn backend_node(nodes: &Api<Node>, name: &str) -> Result<()> {
    create_initialised(nodes, name, &format!("fake://{name}")).await
}

#[tokio::test]
async fn load_balancer_lifecycle_with_finalizer_status_events_and_node_changes() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let client = cluster.client().await?;
    let cloud = Arc::new(FakeCloud::new());
    let nodes: Api<Node> = Api::all(client.clone());
    backend_node(&nodes, "lb-node-1").await?;
    let _c = start_controllers(
        client.clone(),
        cloud.clone(),
        ControllersConfig::default(),
        &[service::NAME],
    )
    .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .create(&PostParams::default(), &lb_service("web"))
        .await?;

    let svc = wait_for("ingress", T, || async {
        services
            .get("web")
            .await
            .ok()
            .filter(|s| ingress_hostname(s).is_some())
    })
    .await?;
    let lb_name = k8s_cloud_provider::service::helpers::default_load_balancer_name(&svc);
    assert_eq!(ingress_hostname(&svc).unwrap(), format!("{lb_name}.lb.fake"));
    assert!(
        svc.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&FINALIZER_LOAD_BALANCER_CLEANUP.to_string())
    );
    assert_eq!(cloud.load_balancers()[&lb_name].nodes, vec!["lb-node-1"]);
    let events = wait_for("Ensured event", T, || async {
        let e = events_for(&client, "default", "web").await.ok()?;
        e.iter().any(|x| x.0 == "EnsuredLoadBalancer").then_some(e)
    })
    .await?;
    assert!(events.iter().any(|e| e.0 == "EnsuringLoadBalancer"
        && e.1 == "Ensuring load balancer"
        && e.2 == "service-controller"));
    assert!(
        events
            .iter()
            .any(|e| e.0 == "EnsuredLoadBalancer" && e.1 == "Ensured load balancer")
    );

    // A node joins: the LB is updated with the new set.
    backend_node(&nodes, "lb-node-2").await?;
    wait_for("LB has two nodes", T, || async {
        (cloud.load_balancers().get(&lb_name)?.nodes == vec!["lb-node-1", "lb-node-2"]).then_some(())
    })
    .await?;
    assert!(
        cloud
            .calls_starting_with("UpdateLoadBalancer default/web [lb-node-1 lb-node-2]")
            .len()
            == 1
    );
    // An excluded node leaves the set.
    let patch = serde_json::json!({"metadata": {"labels": {"node.kubernetes.io/exclude-from-external-load-balancers": ""}}});
    nodes
        .patch("lb-node-1", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    wait_for("LB has one node", T, || async {
        (cloud.load_balancers().get(&lb_name)?.nodes == vec!["lb-node-2"]).then_some(())
    })
    .await?;
    let events = wait_for("UpdatedLoadBalancer", T, || async {
        let e = events_for(&client, "default", "web").await.ok()?;
        e.iter().any(|x| x.0 == "UpdatedLoadBalancer").then_some(e)
    })
    .await?;
    assert!(
        events
            .iter()
            .any(|e| e.1 == "Updated load balancer with new hosts")
    );

    // Deleted: LB deleted, then the finalizer goes and the object disappears.
    services.delete("web", &DeleteParams::default()).await?;
    wait_for("service gone", T, || async {
        services.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await?;
    assert!(cloud.load_balancers().is_empty());
    let deleted_at = cloud
        .calls()
        .iter()
        .position(|c| c.starts_with("EnsureLoadBalancerDeleted default/web"));
    assert!(deleted_at.is_some());
    Ok(())
}

/// A Service of another load-balancer controller (`spec.loadBalancerClass`, which current API
/// servers keep) gets nothing: no cloud call, no finalizer, no status, no event. A second sync
/// of a Service of ours whose load balancer did not change writes no status again, although
/// the provider answers an address without `ipMode` and the API server stored `ipMode: VIP`.
#[tokio::test]
async fn another_controllers_class_is_never_touched_and_an_unchanged_status_is_not_written_again()
-> Result<()> {
    let cluster = TestCluster::start().await?;
    let client = cluster.client().await?;
    let cloud = Arc::new(FakeCloud::new());
    cloud.set_ingress_ip(Some("192.0.2.10"));
    let nodes: Api<Node> = Api::all(client.clone());
    backend_node(&nodes, "class-node").await?;
    let _c = start_controllers(
        client.clone(),
        cloud.clone(),
        ControllersConfig::default(),
        &[service::NAME],
    )
    .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let mut theirs = lb_service("theirs");
    theirs.spec.as_mut().unwrap().load_balancer_class = Some("example.com/other-lb".into());
    services.create(&PostParams::default(), &theirs).await?;
    services
        .create(&PostParams::default(), &lb_service("ours"))
        .await?;
    let served = wait_for("ours served", T, || async {
        let s = services.get("ours").await.ok()?;
        rcp_e2e::k8s::ingress_ip(&s).map(|_| s)
    })
    .await?;
    let stored = served
        .status
        .and_then(|s| s.load_balancer?.ingress)
        .unwrap_or_default();
    assert_eq!(
        stored[0].ip_mode.as_deref(),
        Some("VIP"),
        "the API server defaults ipMode"
    );
    // Two more syncs of ours (an annotation change makes the controller ensure it again). The
    // syncs of one Service never overlap, so the third one starting proves the second one,
    // status decision included, is over.
    for (round, calls) in [("1", 2), ("2", 3)] {
        let patch = serde_json::json!({"metadata": {"annotations": {"example.com/touched": round}}});
        services
            .patch("ours", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        wait_for("another EnsureLoadBalancer for ours", T, || async {
            (cloud.calls_starting_with("EnsureLoadBalancer default/ours").len() >= calls).then_some(())
        })
        .await?;
    }

    let theirs = services.get("theirs").await?;
    assert_eq!(
        theirs
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_class.as_deref()),
        Some("example.com/other-lb"),
        "the API server keeps spec.loadBalancerClass"
    );
    assert!(theirs.metadata.finalizers.unwrap_or_default().is_empty());
    assert!(
        services
            .get("theirs")
            .await?
            .status
            .and_then(|s| s.load_balancer?.ingress)
            .is_none()
    );
    assert!(
        cloud.calls().iter().all(|c| !c.contains("default/theirs")),
        "{:?}",
        cloud.calls()
    );
    assert!(events_for(&client, "default", "theirs").await?.is_empty());
    // Writes of `status.loadBalancer` (the finalizer goes through the status subresource
    // too, as upstream adds it).
    let status_writes = |name: &str| {
        cluster
            .audit_writes()
            .into_iter()
            .filter(|e| {
                e["objectRef"]["resource"] == "services"
                    && e["objectRef"]["subresource"] == "status"
                    && e["objectRef"]["name"] == name
                    && e["requestObject"].get("status").is_some()
            })
            .count()
    };
    assert_eq!(status_writes("theirs"), 0);
    assert_eq!(
        status_writes("ours"),
        1,
        "the second sync wrote the same status again"
    );
    Ok(())
}

#[tokio::test]
async fn type_changes_create_and_delete_the_load_balancer() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let client = cluster.client().await?;
    let cloud = Arc::new(FakeCloud::new());
    let nodes: Api<Node> = Api::all(client.clone());
    backend_node(&nodes, "tn-1").await?;
    let _c = start_controllers(
        client.clone(),
        cloud.clone(),
        ControllersConfig::default(),
        &[service::NAME],
    )
    .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let mut s = lb_service("flip");
    s.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
    services.create(&PostParams::default(), &s).await?;
    // Proof that the controller has seen "flip": a LoadBalancer Service created after it has
    // its load balancer (the informer delivers events in order, one worker takes them in order).
    services
        .create(&PostParams::default(), &lb_service("marker"))
        .await?;
    wait_for("marker ingress", T, || async {
        services
            .get("marker")
            .await
            .ok()
            .filter(|s| ingress_hostname(s).is_some())
    })
    .await?;
    assert!(
        cloud
            .calls_starting_with("EnsureLoadBalancer default/flip")
            .is_empty(),
        "ClusterIP makes no cloud call: {:?}",
        cloud.calls()
    );

    let to_lb = serde_json::json!({"spec": {"type": "LoadBalancer"}});
    services
        .patch("flip", &PatchParams::default(), &Patch::Merge(&to_lb))
        .await?;
    wait_for("ingress", T, || async {
        services
            .get("flip")
            .await
            .ok()
            .filter(|s| ingress_hostname(s).is_some())
    })
    .await?;
    assert_eq!(cloud.load_balancers().len(), 2, "marker's and flip's");

    let to_cluster_ip = serde_json::json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80, "protocol": "TCP", "nodePort": null}]}});
    services
        .patch("flip", &PatchParams::default(), &Patch::Merge(&to_cluster_ip))
        .await?;
    let s = wait_for("finalizer removed and status cleared", T, || async {
        let s = services.get("flip").await.ok()?;
        (!s.metadata
            .finalizers
            .clone()
            .unwrap_or_default()
            .contains(&FINALIZER_LOAD_BALANCER_CLEANUP.to_string())
            && ingress_hostname(&s).is_none())
        .then_some(s)
    })
    .await?;
    assert_eq!(
        cloud.load_balancers().len(),
        1,
        "flip's LB deleted, marker's kept"
    );
    assert_eq!(s.spec.unwrap().type_.as_deref(), Some("ClusterIP"));
    wait_for_event(&client, "default", "flip", T, |reason, message| {
        reason == "DeletedLoadBalancer" && message == "Deleted load balancer"
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn failing_load_balancer_gets_a_warning_and_retries() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let client = cluster.client().await?;
    let cloud = Arc::new(FakeCloud::new());
    cloud.fail("EnsureLoadBalancer", FakeError::Retry(Duration::from_millis(300)));
    let _c = start_controllers(
        client.clone(),
        cloud.clone(),
        ControllersConfig::default(),
        &[service::NAME],
    )
    .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .create(&PostParams::default(), &lb_service("busy"))
        .await?;
    // A provider Retry re-queues after exactly its delay (not 5 s back-off): several attempts fast.
    wait_for("3 attempts", Duration::from_secs(10), || async {
        (cloud.calls_starting_with("EnsureLoadBalancer default/busy").len() >= 3).then_some(())
    })
    .await?;
    wait_for_event(&client, "default", "busy", T, |reason, message| {
        reason == "SyncLoadBalancerFailed"
            && message.starts_with("Error syncing load balancer: failed to ensure load balancer: fake retry")
    })
    .await?;
    wait_for_event(&client, "default", "busy", T, |reason, message| {
        reason == "UnAvailableLoadBalancer" && message == "There are no available nodes for LoadBalancer"
    })
    .await?;
    // The finalizer was added before the cloud was called.
    let s = services.get("busy").await?;
    assert!(
        s.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&FINALIZER_LOAD_BALANCER_CLEANUP.to_string())
    );
    cloud.clear_failure("EnsureLoadBalancer");
    wait_for("ingress after recovery", T, || async {
        services
            .get("busy")
            .await
            .ok()
            .filter(|s| ingress_hostname(s).is_some())
    })
    .await?;
    Ok(())
}

async fn node_with_cidr(nodes: &Api<Node>, name: &str, cidr: &str) -> Result<()> {
    let mut n = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
        provider_id: Some(format!("fake://{name}")),
        pod_cidr: Some(cidr.into()),
        pod_cidrs: Some(vec![cidr.into()]),
        ..Default::default()
    });
    nodes.create(&PostParams::default(), &n).await?;
    Ok(())
}

fn network_unavailable(n: &Node) -> Option<(String, String, String)> {
    let c = n
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "NetworkUnavailable")?;
    Some((
        c.status.clone(),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    ))
}

#[tokio::test]
async fn routes_follow_pod_cidrs_inside_the_cluster_cidr_only() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let client = cluster.client().await?;
    let cloud = Arc::new(FakeCloud::new());
    // A route the controller does not own (outside the cluster CIDR) and a stale one inside.
    cloud.add_route(Route::new("gateway", "192.168.0.0/24").with_name("vpn"));
    cloud.add_route(Route::new("old-node", "10.244.9.0/24").with_name("stale"));
    let nodes: Api<Node> = Api::all(client.clone());
    node_with_cidr(&nodes, "r-1", "10.244.1.0/24").await?;
    node_with_cidr(&nodes, "r-2", "10.244.2.0/24").await?;
    let config = ControllersConfig {
        cluster_cidrs: vec!["10.244.0.0/16".parse()?],
        route_reconciliation_period: Duration::from_millis(300),
        ..Default::default()
    };
    let _c = start_controllers(client.clone(), cloud.clone(), config, &[route::NAME]).await?;

    wait_for("routes for both nodes", T, || async {
        let r = cloud.routes();
        (r.get("10.244.1.0/24")?.target_node == "r-1" && r.get("10.244.2.0/24")?.target_node == "r-2")
            .then_some(())
    })
    .await?;
    for name in ["r-1", "r-2"] {
        let c = wait_for("NetworkUnavailable=False", T, || async {
            network_unavailable(&nodes.get(name).await.ok()?).filter(|c| c.0 == "False")
        })
        .await?;
        assert_eq!(
            c,
            (
                "False".into(),
                "RouteCreated".into(),
                "RouteController created a route".into()
            )
        );
    }
    wait_for("stale route removed", T, || async {
        (!cloud.routes().contains_key("10.244.9.0/24")).then_some(())
    })
    .await?;

    nodes.delete("r-2", &DeleteParams::default()).await?;
    wait_for("route of the deleted node removed", T, || async {
        (!cloud.routes().contains_key("10.244.2.0/24")).then_some(())
    })
    .await?;
    assert!(
        cloud.routes().contains_key("192.168.0.0/24"),
        "a route outside the cluster CIDR is left alone"
    );
    assert!(cloud.calls_starting_with("DeleteRoute gateway").is_empty());

    // A route the cloud refuses: NetworkUnavailable=True and a FailedToCreateRoute event.
    cloud.fail("CreateRoute", FakeError::Other("route table full".into()));
    node_with_cidr(&nodes, "r-3", "10.244.3.0/24").await?;
    let c = wait_for("NetworkUnavailable=True on r-3", T, || async {
        network_unavailable(&nodes.get("r-3").await.ok()?)
    })
    .await?;
    assert_eq!(
        c,
        (
            "True".into(),
            "NoRouteCreated".into(),
            "RouteController failed to create a route".into()
        )
    );
    let ev = wait_for("FailedToCreateRoute", T, || async {
        events_for(&client, "default", "r-3")
            .await
            .ok()?
            .into_iter()
            .find(|e| e.0 == "FailedToCreateRoute")
    })
    .await?;
    assert!(
        ev.1.contains("10.244.3.0/24 for node r-3 after") && ev.1.ends_with("route table full"),
        "{ev:?}"
    );
    assert_eq!(ev.2, "route_controller");
    Ok(())
}

#[tokio::test]
async fn legacy_instances_path_initialises_with_zones() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let client: Client = cluster.client().await?;
    let mut fake = FakeCloud::new();
    fake.enable_instances_v2 = false;
    let cloud = Arc::new(fake);
    cloud.add_instance("legacy", fake_instance(3));
    let _c = start_controllers(
        client.clone(),
        cloud.clone(),
        ControllersConfig::default(),
        &[node::NAME],
    )
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &tainted_node("legacy"))
        .await?;
    let n = wait_for("legacy initialised", T, || initialised(&nodes, "legacy")).await?;
    assert_eq!(
        n.spec.as_ref().unwrap().provider_id.as_deref(),
        Some("fake://i-0003")
    );
    assert_eq!(
        n.metadata.labels.as_ref().unwrap()["topology.kubernetes.io/zone"],
        "zone-b"
    );
    assert!(cloud.calls_starting_with("InstanceID legacy").len() == 1);
    assert!(
        cloud
            .calls_starting_with("GetZoneByProviderID fake://i-0003")
            .len()
            == 1
    );
    assert!(
        cloud.calls_starting_with("InstanceMetadata").is_empty(),
        "the V2 path is not used"
    );
    Ok(())
}

#[tokio::test]
async fn lifecycle_never_deletes_a_node_replaced_while_the_cloud_answered() -> Result<()> {
    // The cloud says "gone" for the old Node's instance only after 6 s; meanwhile the Node is
    // deleted and re-created under the same name for a new instance. The delete carries the
    // old UID as precondition, so the new Node survives.
    let cluster = TestCluster::start().await?;
    let client = cluster.client().await?;
    let cloud = Arc::new(FakeCloud::new());
    cloud.add_instance("replacement", FakeInstance::new("fake://new"));
    let nodes: Api<Node> = Api::all(client.clone());
    create_initialised(&nodes, "swapped", "fake://old").await?;
    set_ready(&nodes, "swapped", "False").await?;
    cloud.set_latency(Duration::from_secs(6));
    let config = ControllersConfig {
        node_monitor_period: Duration::from_millis(200),
        ..Default::default()
    };
    let _c = start_controllers(client.clone(), cloud.clone(), config, &[nodelifecycle::NAME]).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        cloud.calls_starting_with("InstanceExists swapped").is_empty(),
        "the first check is still in flight"
    );
    nodes.delete("swapped", &Default::default()).await?;
    wait_for("old Node gone", T, || async {
        nodes.get_opt("swapped").await.ok()?.is_none().then_some(())
    })
    .await?;
    create_initialised(&nodes, "swapped", "fake://new").await?;
    set_ready(&nodes, "swapped", "False").await?;
    let new_uid = nodes.get("swapped").await?.metadata.uid;
    wait_for(
        "the in-flight check answered (gone) and a second check ran",
        T,
        || async { (cloud.calls_starting_with("InstanceExists swapped").len() >= 2).then_some(()) },
    )
    .await?;
    let now = nodes.get_opt("swapped").await?;
    assert_eq!(
        now.and_then(|n| n.metadata.uid),
        new_uid,
        "the replacement Node was not deleted for the old instance"
    );
    Ok(())
}

#[tokio::test]
async fn a_hung_cloud_call_times_out_and_never_stalls_the_other_services() -> Result<()> {
    // One service worker (the default) and a cloud whose EnsureLoadBalancer never returns for
    // one Service: that call is abandoned after --cloud-call-timeout, a Warning says why, and
    // the next Service still gets its load balancer.
    let cluster = TestCluster::start().await?;
    let client = cluster.client().await?;
    let cloud = Arc::new(FakeCloud::new());
    cloud.hang("EnsureLoadBalancer default/stuck");
    let nodes: Api<Node> = Api::all(client.clone());
    backend_node(&nodes, "hang-node-1").await?;
    let config = ControllersConfig {
        cloud_call_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let c = start_controllers(client.clone(), cloud.clone(), config, &[service::NAME]).await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .create(&PostParams::default(), &lb_service("stuck"))
        .await?;
    services
        .create(&PostParams::default(), &lb_service("fine"))
        .await?;
    wait_for("the other Service's ingress", T, || async {
        services
            .get("fine")
            .await
            .ok()
            .filter(|s| ingress_hostname(s).is_some())
    })
    .await?;
    let warning = wait_for("a Warning on the stuck Service", T, || async {
        events_for(&client, "default", "stuck")
            .await
            .ok()?
            .into_iter()
            .find(|e| e.0 == "SyncLoadBalancerFailed")
    })
    .await?;
    assert!(warning.1.contains("did not return within 2s"), "{warning:?}");
    let timeouts = c
        .ctx
        .cloud_metrics
        .cloud_call_timeouts
        .with_label_values(&["service-lb-controller", "EnsureLoadBalancer"])
        .get();
    assert!(timeouts >= 1, "counted: {timeouts}");
    // The workers are never stuck for long (each call is bounded); a probe beyond twice the
    // timeout fails the controller's health check.
    assert!(c.ctx.stuck_worker(service::NAME).is_ok());
    c.ctx
        .worker_probes
        .lock()
        .entry("probe-test".into())
        .or_default()
        .push(Arc::new(|| Duration::from_secs(10)));
    let e = c.ctx.stuck_worker("probe-test").unwrap_err();
    assert!(e.contains("more than 4s"), "{e}");
    Ok(())
}
