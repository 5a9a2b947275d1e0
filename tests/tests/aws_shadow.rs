//! Shadow mode (`--dry-run`) on the real AWS binary, kube-apiserver and moto.
//!
//! The world: two initialised Nodes (the load balancers' backends), two Nodes still carrying
//! the `uninitialized` taint, a Node whose instance was terminated, and two `type:
//! LoadBalancer` Services (a classic ELB and an NLB). The tainted and the terminated Nodes
//! carry `node.kubernetes.io/exclude-from-external-load-balancers`, so that the normal run's
//! own writes (initialising them, deleting the terminated one) do not change the load
//! balancers' backends and cause follow-up writes a shadow run cannot foresee.
//!
//! 1. The shadow run: the controller manager runs every controller with `--dry-run` (and the
//!    default `--leader-elect=true`, which shadow mode turns off) until it has shown what it
//!    would do. Then: moto received only `Describe…` requests; the API server's
//!    `apiserver_request_total` counts no write to nodes, services or events that was not a
//!    dry run (and some that were); no Lease was taken; the world is as it was (tainted Nodes,
//!    the terminated instance's Node, Services without finalizer or ingress); the dry-run
//!    actions were counted in `cloud_controller_manager_dry_run_actions_total`.
//! 2. The normal run: the same binary without `--dry-run` converges the world, logging each
//!    write it makes (debug `write` lines of the same choke points).
//! 3. The writes the shadow run announced are exactly the writes the normal run made (as
//!    `(controller, action, object)`; events compared by their namespace, as their names are
//!    made of a timestamp), but for announced writes to an object the normal run deleted
//!    (the shadow run's deletion leaves it there for later passes; the normal run's passes
//!    skip a Node deleted before its turn, whether they come before or after is timing).

use std::{collections::BTreeSet, time::Duration};

use anyhow::{Context as _, Result};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Service},
};
use kube::{Api, Client, api::PostParams};
use nix::sys::signal::Signal;
use rcp_e2e::{
    Moto, TestCluster,
    ccm::{CcmProcess, LOG_WRITES, logged_writes},
    k8s::{
        initialised, load_balancer_service, node_with_provider_id, tainted_node, wait_for, wait_for_ingress,
    },
};

const T: Duration = Duration::from_secs(120);
const EXCLUDE: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// The sum of `apiserver_request_total` for `verb` on `resource` with the given `dry_run`
/// label (`""`: real writes; `"All"`: dry runs).
async fn apiserver_requests(client: &Client, verb: &str, resource: &str, dry_run: &str) -> Result<f64> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| {
            l.contains(&format!("verb=\"{verb}\""))
                && l.contains(&format!("resource=\"{resource}\""))
                && l.contains(&format!("dry_run=\"{dry_run}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Real (not dry-run) writes to the resources the controllers write, per verb and resource.
async fn real_writes(client: &Client) -> Result<Vec<(String, f64)>> {
    let mut all = Vec::new();
    for resource in ["nodes", "services", "events"] {
        for verb in ["POST", "PUT", "PATCH", "DELETE"] {
            all.push((
                format!("{verb} {resource}"),
                apiserver_requests(client, verb, resource, "").await?,
            ));
        }
    }
    Ok(all)
}

fn excluded(mut node: Node) -> Node {
    node.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(EXCLUDE.into(), String::new());
    node
}

#[tokio::test]
async fn shadow_mode_writes_nothing_and_announces_what_the_normal_mode_then_does() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let moto = Moto::start().await?;
    let world = moto.build_world("e2e", 4).await?;
    let config = cluster.dir().join("cloud.conf");
    std::fs::write(&config, moto.cloud_config(&world))?;
    let kubeconfig = cluster.ccm_kubeconfig("aws/base")?;
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), "default");

    // The world.
    for instance in &world.instances[..2] {
        nodes.create(&PostParams::default(), &instance.node()).await?;
    }
    let tainted: Vec<String> = world.instances[2..]
        .iter()
        .map(|i| i.private_dns_name.clone())
        .collect();
    for name in &tainted {
        nodes
            .create(&PostParams::default(), &excluded(tainted_node(name)))
            .await?;
    }
    let doomed = moto.run_instances(&world, 1).await?.remove(0);
    moto.ec2()
        .terminate_instances()
        .instance_ids(&doomed.id)
        .send()
        .await?;
    let gone = excluded(node_with_provider_id("terminated-node", &doomed.provider_id()));
    nodes.create(&PostParams::default(), &gone).await?;
    for (name, annotations) in [("web", vec![]), ("web-nlb", vec![("type", "nlb")])] {
        services
            .create(
                &PostParams::default(),
                &load_balancer_service(name, &annotations, &[(80, "http")]),
            )
            .await?;
    }

    // 1. The shadow run.
    let moto_before = moto.actions().len();
    let real_before = real_writes(&client).await?;
    let dry_before = apiserver_requests(&client, "PATCH", "nodes", "All").await?;
    let mut shadow = CcmProcess::start_with_env(
        "cloud-controller-manager-aws",
        "ccm-aws-shadow",
        &kubeconfig,
        cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--cluster-name=e2e".into(),
            "--dry-run".into(),
            "--logging-format=json".into(),
        ],
        &[moto.sdk_env(), vec![("RUST_LOG", LOG_WRITES)]].concat(),
    )?;
    let announced = |log: &str| -> BTreeSet<(String, String, String)> {
        logged_writes(log)
            .into_iter()
            .filter(|w| w.3)
            .map(|(c, a, o, _)| (c, a, o))
            .collect()
    };
    let expected_first: Vec<(String, String, String)> = [
        ("service-controller", "EnsureLoadBalancer", "default/web"),
        ("service-controller", "EnsureLoadBalancer", "default/web-nlb"),
        ("service-controller", "patch services/status", "default/web"),
        ("service-controller", "patch services/status", "default/web-nlb"),
        ("node-controller", "delete nodes", "terminated-node"),
    ]
    .iter()
    .map(|(c, a, o)| (c.to_string(), a.to_string(), o.to_string()))
    .chain(tainted.iter().map(|n| {
        (
            "node-controller".to_string(),
            "patch nodes".to_string(),
            n.clone(),
        )
    }))
    .collect();
    wait_for("the shadow run to announce its writes", T, || {
        let seen = announced(&shadow.log());
        let missing = expected_first.iter().any(|w| !seen.contains(w));
        async move { (!missing).then_some(()) }
    })
    .await
    .with_context(|| shadow.log())?;
    // Let every controller finish its first pass (the node-lifecycle controller runs every
    // 5 s, the node status updater at start), then stop.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let metrics = shadow.metrics().await?;
    shadow.signal(Signal::SIGTERM)?;
    assert_eq!(
        shadow.wait_exit(Duration::from_secs(30))?,
        Some(0),
        "{}",
        shadow.log()
    );
    let shadow_log = shadow.log();
    let shadow_writes = announced(&shadow_log);
    println!("shadow run announced {} distinct writes:", shadow_writes.len());
    for w in &shadow_writes {
        println!("  {w:?}");
    }

    // Nothing was written to the cloud…
    let moto_requests: Vec<String> = moto.actions()[moto_before..].to_vec();
    let cloud_writes: Vec<&String> = moto_requests
        .iter()
        .filter(|a| !(a.starts_with("Describe") || a.starts_with("Get") || a.starts_with("List")))
        .collect();
    println!(
        "moto: {} requests during the shadow run, {} writes",
        moto_requests.len(),
        cloud_writes.len()
    );
    assert!(!moto_requests.is_empty(), "the shadow run read the cloud");
    assert!(cloud_writes.is_empty(), "{cloud_writes:?}");
    // … nor to the API server (its writes were dry runs)…
    let real_after = real_writes(&client).await?;
    assert_eq!(real_before, real_after, "writes that were not dry runs");
    let dry_after = apiserver_requests(&client, "PATCH", "nodes", "All").await?;
    assert!(dry_after > dry_before, "node patches were sent as dry runs");
    // … no lease was taken, and the world is as it was.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    assert!(leases.get_opt("cloud-controller-manager").await?.is_none());
    for name in &tainted {
        assert!(
            initialised(&nodes, name).await.is_none(),
            "{name} is still tainted"
        );
    }
    assert!(nodes.get_opt("terminated-node").await?.is_some());
    for name in ["web", "web-nlb"] {
        let s = services.get(name).await?;
        assert!(s.metadata.finalizers.unwrap_or_default().is_empty(), "{name}");
        assert!(
            s.status.and_then(|s| s.load_balancer?.ingress).is_none(),
            "{name}"
        );
    }
    let counted = |action: &str| -> f64 {
        let prefix = format!(
            "cloud_controller_manager_dry_run_actions_total{{action=\"{action}\",controller=\"service-controller\"}} "
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
            .unwrap_or(0.0)
    };
    println!(
        "dry-run actions counted: EnsureLoadBalancer {}, patch services/status {}",
        counted("EnsureLoadBalancer"),
        counted("patch services/status")
    );
    assert!(counted("EnsureLoadBalancer") >= 2.0, "{metrics}");
    assert!(counted("patch services/status") >= 2.0, "{metrics}");

    // 2. The normal run.
    let mut normal = CcmProcess::start_with_env(
        "cloud-controller-manager-aws",
        "ccm-aws-normal",
        &kubeconfig,
        cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--cluster-name=e2e".into(),
            "--leader-elect=false".into(),
            "--logging-format=json".into(),
        ],
        &[moto.sdk_env(), vec![("RUST_LOG", LOG_WRITES)]].concat(),
    )?;
    for name in ["web", "web-nlb"] {
        wait_for_ingress(&services, name, T).await?;
    }
    for name in &tainted {
        wait_for(&format!("{name} initialised"), T, || initialised(&nodes, name)).await?;
    }
    wait_for("the terminated instance's Node deleted", T, || async {
        nodes
            .get_opt("terminated-node")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(8)).await;
    normal.signal(Signal::SIGTERM)?;
    assert_eq!(
        normal.wait_exit(Duration::from_secs(30))?,
        Some(0),
        "{}",
        normal.log()
    );
    let normal_writes: BTreeSet<(String, String, String)> = logged_writes(&normal.log())
        .into_iter()
        .filter(|w| !w.3)
        .map(|(c, a, o, _)| (c, a, o))
        .collect();
    println!("normal run made {} distinct writes", normal_writes.len());

    // 3. What the shadow run announced is what the normal run did — except writes to an
    //    object that the normal run deleted: a deletion the shadow run only announces leaves
    //    the object there for later passes (e.g. the address sync) to write to, while the
    //    normal run's passes skip a Node deleted before its turn.
    let deleted: BTreeSet<&str> = normal_writes
        .iter()
        .filter(|(_, action, _)| action.starts_with("delete "))
        .map(|(_, _, object)| object.as_str())
        .collect();
    let only_shadow: Vec<_> = shadow_writes
        .difference(&normal_writes)
        .filter(|(_, action, object)| action.starts_with("delete ") || !deleted.contains(object.as_str()))
        .collect();
    let only_normal: Vec<_> = normal_writes.difference(&shadow_writes).collect();
    assert!(
        only_shadow.is_empty() && only_normal.is_empty(),
        "announced but not done: {only_shadow:#?}\ndone but not announced: {only_normal:#?}"
    );
    assert!(
        moto.actions()[moto_before..]
            .iter()
            .any(|a| a == "CreateLoadBalancer")
    );
    Ok(())
}

/// A provider's own controller writes to the cloud without the framework's load balancer and
/// route calls: the AWS tagging controller in shadow mode is stopped by the provider's SDK
/// guard. Its `CreateTags` calls are announced and counted, none reaches moto, and the Nodes
/// get no tagging label (that write is after the tags, so it never comes).
#[tokio::test]
async fn shadow_mode_stops_a_provider_controllers_cloud_writes() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let moto = Moto::start().await?;
    let world = moto.build_world("e2e", 2).await?;
    let config = cluster.dir().join("cloud.conf");
    std::fs::write(&config, moto.cloud_config(&world))?;
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for i in &world.instances {
        nodes.create(&PostParams::default(), &i.node()).await?;
    }
    let moto_before = moto.actions().len();
    let mut ccm = CcmProcess::start_with_env(
        "cloud-controller-manager-aws",
        "ccm-aws-shadow-tagging",
        &cluster.ccm_kubeconfig("aws/base")?,
        cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--cluster-name=e2e".into(),
            "--controllers=tagging".into(),
            "--tags=team=blue".into(),
            "--resources=instance".into(),
            "--dry-run".into(),
            "--logging-format=json".into(),
        ],
        &[moto.sdk_env(), vec![("RUST_LOG", LOG_WRITES)]].concat(),
    )?;
    let announced = wait_for("the tags to be announced for every instance", T, || {
        let tags: Vec<String> = logged_writes(&ccm.log())
            .into_iter()
            .filter(|(c, a, _, dry)| *dry && c == "aws" && a.ends_with(":CreateTags"))
            .map(|(_, _, o, _)| o)
            .collect();
        let all = world
            .instances
            .iter()
            .all(|i| tags.iter().any(|o| o.contains(&i.id)));
        async move { all.then_some(tags) }
    })
    .await
    .with_context(|| ccm.log())?;
    println!("announced: {:?}", announced.first());
    let metrics = ccm.metrics().await?;
    ccm.signal(Signal::SIGTERM)?;
    assert_eq!(ccm.wait_exit(Duration::from_secs(30))?, Some(0), "{}", ccm.log());
    let sent: Vec<String> = moto.actions()[moto_before..].to_vec();
    assert!(!sent.iter().any(|a| a == "CreateTags"), "{sent:?}");
    assert!(
        metrics.lines().any(
            |l| l.starts_with("cloud_controller_manager_dry_run_actions_total{")
                && l.contains("controller=\"aws\"")
                && l.contains("CreateTags")
        ),
        "{metrics}"
    );
    for i in &world.instances {
        let node = nodes.get(&i.private_dns_name).await?;
        let labels = node.metadata.labels.unwrap_or_default();
        assert!(!labels.keys().any(|k| k.contains("tagging")), "{labels:?}");
    }
    Ok(())
}
