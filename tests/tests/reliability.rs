//! Reliability under faults, short forms of the benchmarks (`hack/bench-crash-trials.sh`,
//! `bench-cloud-faults`): the AWS CCM SIGKILLed mid-operation and restarted, and the AWS API
//! answering 30 % of the requests with throttling, server errors, resets, delays and lost
//! answers. In both, every Service's load balancer converges, and the cloud (read from moto
//! directly) never holds a second load balancer for a Service nor anything of a deleted one.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rand::Rng;
use rcp_e2e::{
    aws_chaos::{AwsChaosRig, crash_trial, median_max},
    fault_proxy::{FaultApi, FaultKind, RandomFaults},
};

/// Per step; generous (a slow CI machine must not fail the test): the figures are printed.
const LIMIT: Duration = Duration::from_secs(240);
/// Per step under sustained faults. The AWS SDK's standard retry mode (upstream's too) spends a
/// retry quota of 500 tokens that only successes refill: 30 % faults drain it within a few
/// hundred calls, from then on most failed calls are not retried and several syncs of a Service
/// in a row can fail; the service controller then backs off as upstream's does (5 s doubling,
/// 300 s at most). Six failed syncs in a row wait 315 s: a step may take that long and still be
/// correct, which is what this test is about.
const FAULT_LIMIT: Duration = Duration::from_secs(420);

#[tokio::test]
async fn crash_trials_leave_no_leaked_or_duplicated_cloud_resources() -> Result<()> {
    let trials: usize = env_or("RCP_CRASH_TRIALS", 5);
    let rig = AwsChaosRig::start(2, &[]).await?;
    // A warm-up lifecycle without a kill gives the span over which kills are spread.
    let warm = rig.service_lifecycle("warm-up", LIMIT).await?;
    assert!(warm.problems.is_empty(), "{:?}", warm.problems);
    let span = warm
        .converged
        .last()
        .map(|(_, t)| *t)
        .unwrap_or_else(Instant::now)
        - warm.started.unwrap_or_else(Instant::now);
    let span = span.max(Duration::from_millis(500));
    let mut results = Vec::new();
    for i in 0..trials {
        let kill_at = Duration::from_millis(rand::rng().random_range(0..span.as_millis() as u64));
        let r = crash_trial(&rig, i, kill_at, LIMIT).await;
        println!(
            "trial {i}: killed at {:?} during {:?}, converged {:?} after the kill, lifecycle {:?}, problems {:?}",
            r.kill_at, r.killed_during, r.convergence, r.took, r.problems
        );
        results.push(r);
    }
    let leftovers = rig.leftovers(LIMIT).await?;
    let problems: Vec<_> = results.iter().flat_map(|r| r.problems.clone()).collect();
    let duplicates = problems
        .iter()
        .filter(|p| p.contains("duplicate") || p.contains(" load balancers") || p.contains("target groups"))
        .count();
    let leaks = problems.iter().filter(|p| p.contains("left")).count();
    let convergence: Vec<Duration> = results.iter().filter_map(|r| r.convergence).collect();
    let (median, max) = median_max(&convergence);
    let mut during: std::collections::BTreeMap<String, usize> = Default::default();
    for r in &results {
        *during.entry(format!("{:?}", r.killed_during)).or_default() += 1;
    }
    println!(
        "crash trials: {trials} trials (kills during {during:?}), {} CCM starts; leaks {leaks}, duplicates {duplicates}, other problems {}; convergence after a kill median {median:.2?} max {max:.2?}; leftovers at the end {leftovers:?}",
        rig.starts(),
        problems.len() - leaks - duplicates,
    );
    assert!(problems.is_empty(), "leaks or duplicates: {problems:#?}");
    assert_eq!(
        rig.starts(),
        trials + 1,
        "every trial killed and restarted the CCM once"
    );
    assert!(
        leftovers.classic.is_empty()
            && leftovers.network.is_empty()
            && leftovers.target_groups.is_empty()
            && leftovers.security_groups.is_empty()
            && leftovers.node_group_rules == rig.node_rules_at_start(),
        "cluster-owned resources left after every Service was deleted: {leftovers:?}"
    );
    Ok(())
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `RCP_FAULT_SHARE` (default 0.3), `RCP_FAULT_SERVICES` (2), `RCP_FAULT_KINDS` (`all`, or
/// `throttle`) and `RCP_FAULT_LIMIT_SECS` (each step's limit, 420) let
/// `hack/bench-cloud-faults.sh` run the same scenario as a benchmark.
#[tokio::test]
async fn load_balancers_converge_under_30_percent_cloud_faults() -> Result<()> {
    let share: f64 = env_or("RCP_FAULT_SHARE", 0.3);
    let count: usize = env_or("RCP_FAULT_SERVICES", 2);
    let kinds = match std::env::var("RCP_FAULT_KINDS").as_deref() {
        Ok("throttle") => vec![FaultKind::Throttle],
        _ => FaultKind::ALL.to_vec(),
    };
    let limit = Duration::from_secs(env_or("RCP_FAULT_LIMIT_SECS", FAULT_LIMIT.as_secs()));
    let rig = AwsChaosRig::start(2, &[]).await?;
    rig.proxy.reset_counts();
    let calls_before = rig
        .metric("cloudprovider_aws_api_request_duration_seconds_count")
        .await;
    rig.proxy.set_random_faults(Some(RandomFaults {
        share,
        kinds: kinds.clone(),
        only: vec!["Action=".into()],
        api: FaultApi::Aws,
    }));
    let start = Instant::now();
    let lifecycles = futures::future::join_all((0..count).map(|i| {
        let rig = rig.clone();
        async move { rig.service_lifecycle(&format!("faulty-{i}"), limit).await }
    }))
    .await;
    let took = start.elapsed();
    rig.proxy.set_random_faults(None);
    let mut problems = Vec::new();
    for l in lifecycles {
        match l {
            Ok(l) => problems.extend(l.problems),
            Err(e) => {
                // What the CCM said about the Services, to see why one did not converge.
                let log = rig.ccm_log().await;
                for line in log
                    .lines()
                    .filter(|l| l.contains("faulty-") && !l.contains(" INFO "))
                {
                    eprintln!("{line}");
                }
                return Err(e);
            }
        }
    }
    let leftovers = rig.leftovers(limit).await?;
    let requests = rig.proxy.total();
    let logical = rig
        .metric("cloudprovider_aws_api_request_duration_seconds_count")
        .await
        - calls_before;
    let throttled = rig.metric("cloudprovider_aws_api_throttled_requests_total").await;
    let errors = rig.metric("cloudprovider_aws_api_request_errors").await;
    let panics = rig.metric_read("controller_panics_total").await?;
    println!(
        "faults {:.0} % ({kinds:?}): {count} Services through create/add port/NLB/delete in {took:.1?}; {requests} HTTP requests ({} faulted: {:?}); {logical} provider calls ({errors} failed after the SDK's retries); {:.2} HTTP requests per provider call; {:.2} requests/s; throttled attempts counted {throttled}; panics {panics}",
        share * 100.0,
        rig.proxy.faulted(),
        rig.proxy.faulted_by_kind(),
        requests as f64 / logical.max(1.0),
        requests as f64 / took.as_secs_f64(),
    );
    assert!(problems.is_empty(), "{problems:#?}");
    let clean = leftovers.classic.is_empty()
        && leftovers.network.is_empty()
        && leftovers.target_groups.is_empty()
        && leftovers.security_groups.is_empty()
        && leftovers.node_group_rules == rig.node_rules_at_start();
    if !clean {
        // What the CCM said about what was left, to see how it came to be left.
        let names: Vec<String> = leftovers
            .classic
            .values()
            .chain(leftovers.network.values())
            .chain(leftovers.target_groups.values())
            .flatten()
            .cloned()
            .chain(leftovers.security_groups.keys().cloned())
            .collect();
        let log = rig.ccm_log().await;
        for line in log.lines().filter(|l| {
            names.iter().any(|n| l.contains(n.as_str())) || l.contains(" WARN ") || l.contains(" ERROR ")
        }) {
            eprintln!("{line}");
        }
        eprintln!("node-group rules at the start: {:?}", rig.node_rules_at_start());
    }
    assert!(clean, "left behind: {leftovers:?}");
    assert_eq!(panics, 0.0);
    // The Nodes went through the same faults (the node and lifecycle controllers share the
    // cloud): every one is still there, initialised, and none was marked shut down.
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(rig.cluster.client().await?);
    for name in rig.world.node_names() {
        let node = nodes
            .get_opt(name)
            .await?
            .with_context(|| format!("Node {name} was deleted under cloud faults"))?;
        let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        assert!(
            !taints
                .iter()
                .any(|t| t.key == k8s_cloud_provider::well_known::TAINT_SHUTDOWN
                    || t.key == k8s_cloud_provider::well_known::TAINT_UNINITIALIZED),
            "Node {name}: {taints:?}"
        );
    }
    if share > 0.0 {
        assert!(rig.proxy.faulted() > 0, "faults were injected");
        assert!(
            throttled > 0.0,
            "throttling answers are counted in the throttling metric"
        );
    }
    Ok(())
}

fn fake_cloud_config(cluster: &rcp_e2e::TestCluster, nodes: usize) -> Result<std::path::PathBuf> {
    let names: Vec<String> = (0..nodes).map(|i| format!("node-{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    rcp_e2e::k8s::write_fake_cloud_config(cluster.dir(), &names)
}

/// The fake-cloud CCM named `name` with `nodes` machines, reaching the API server through
/// `kubeconfig`, with these extra flags.
fn start_fake_ccm(
    cluster: &rcp_e2e::TestCluster,
    kubeconfig: &std::path::Path,
    name: &str,
    nodes: usize,
    extra: &[&str],
) -> Result<rcp_e2e::ccm::CcmProcess> {
    let config = fake_cloud_config(cluster, nodes)?;
    let mut args = vec![
        format!("--cloud-config={}", config.display()),
        "--cluster-cidr=10.244.0.0/16".to_string(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    rcp_e2e::ccm::CcmProcess::start(
        "fake-cloud-controller-manager",
        name,
        kubeconfig,
        cluster.dir(),
        &args,
    )
}

fn lb_service(name: &str) -> k8s_openapi::api::core::v1::Service {
    rcp_e2e::k8s::load_balancer_service(name, &[], &[(80, "http")])
}

/// kube-apiserver killed with SIGKILL and restarted on the same etcd, twice, with etcd
/// compacted past the informers' resource versions while it is down (their watches resume
/// with `410 Gone` and must re-list). The CCM stays up (the outage is shorter than the renew
/// deadline), and Nodes and Services created and deleted right after each restart are all
/// handled. Prints the recovery time of each round.
#[tokio::test]
async fn informers_recover_from_api_server_restarts_and_etcd_compaction() -> Result<()> {
    use k8s_openapi::api::core::v1::{Node, Service};
    use kube::{
        Api,
        api::{DeleteParams, PostParams},
    };
    use rcp_e2e::k8s::{initialised, tainted_node, wait_for, wait_for_ingress};
    let mut cluster = rcp_e2e::TestCluster::start().await?;
    let mut ccm = start_fake_ccm(
        &cluster,
        cluster.kubeconfig_path(),
        "ccm",
        4,
        &[
            // The outages here (≈ 3 s + the API server's start, up to ~15 s on a loaded CI
            // machine) must stay within the renew deadline: a longer one makes the leader exit,
            // which the next test shows.
            "--leader-elect-lease-duration=90s",
            "--leader-elect-renew-deadline=60s",
        ],
    )?;
    let client = cluster.client().await?;
    let (nodes, services): (Api<Node>, Api<Service>) =
        (Api::all(client.clone()), Api::namespaced(client, "default"));
    nodes
        .create(&PostParams::default(), &tainted_node("node-0"))
        .await?;
    services
        .create(&PostParams::default(), &lb_service("svc-0"))
        .await?;
    wait_for("node-0 initialised", LIMIT, || initialised(&nodes, "node-0")).await?;
    wait_for_ingress(&services, "svc-0", LIMIT).await?;

    for round in 1..=2 {
        // A change in flight when the API server dies.
        nodes
            .create(&PostParams::default(), &tainted_node(&format!("node-{round}")))
            .await?;
        cluster.kill_apiserver();
        let down = Instant::now();
        let revision = cluster.compact_etcd(50).await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let took = cluster.start_apiserver().await?;
        let back = Instant::now();
        let outage = down.elapsed();
        ccm.check_running()?;
        let client = cluster.client().await?;
        let (nodes, services): (Api<Node>, Api<Service>) =
            (Api::all(client.clone()), Api::namespaced(client, "default"));
        // Changes made right after the restart, while the informers are still reconnecting.
        let name = format!("svc-{round}");
        services
            .create(&PostParams::default(), &lb_service(&name))
            .await?;
        services
            .delete(&format!("svc-{}", round - 1), &DeleteParams::default())
            .await?;
        let node = format!("node-{round}");
        if let Err(e) = wait_for("the new Node initialised", LIMIT, || initialised(&nodes, &node)).await {
            panic!(
                "round {round}: {e}; API server ready {took:?} after its start\n{}",
                ccm.log()
            );
        }
        wait_for_ingress(&services, &name, LIMIT).await?;
        wait_for("the deleted Service's finalizer removed", LIMIT, || async {
            services
                .get_opt(&format!("svc-{}", round - 1))
                .await
                .ok()
                .and_then(|s| s.is_none().then_some(()))
        })
        .await?;
        println!(
            "API server restart {round}: down {outage:.1?} (etcd compacted at revision {revision}; ready {took:.1?} after its start); Node initialised, Service provisioned and another deleted {:.1?} after that",
            back.elapsed()
        );
        ccm.check_running()?;
    }
    let log = ccm.log();
    assert!(
        !log.contains("leaderelection lost"),
        "a 3 s outage must not cost the lease"
    );
    let gone = log.matches("too old resource version").count();
    println!("watches that resumed with 410 Gone (and re-listed): {gone}");
    assert!(gone > 0, "the compaction expired the informers' watches:\n{log}");
    Ok(())
}

/// An API-server outage longer than the renew deadline: the leader cannot renew, so it stops
/// (exit 1, `leaderelection lost`, as upstream's CCM, whose kubelet then restarts it) rather
/// than act without a lease. Once the API server is back a new process takes the lease and
/// works. Prints the times.
#[tokio::test]
async fn an_outage_longer_than_the_renew_deadline_makes_the_leader_exit_and_a_restart_recovers() -> Result<()>
{
    use k8s_openapi::api::core::v1::Node;
    use kube::{Api, api::PostParams};
    use rcp_e2e::k8s::{initialised, tainted_node, wait_for};
    let mut cluster = rcp_e2e::TestCluster::start().await?;
    let config = fake_cloud_config(&cluster, 2)?;
    let args = [
        format!("--cloud-config={}", config.display()),
        "--cluster-cidr=10.244.0.0/16".to_string(),
        "--leader-elect-lease-duration=8s".to_string(),
        "--leader-elect-renew-deadline=5s".to_string(),
        "--leader-elect-retry-period=1s".to_string(),
    ];
    let mut ccm = rcp_e2e::ccm::CcmProcess::start(
        "fake-cloud-controller-manager",
        "ccm-a",
        cluster.kubeconfig_path(),
        cluster.dir(),
        &args,
    )?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    nodes
        .create(&PostParams::default(), &tainted_node("node-0"))
        .await?;
    if let Err(e) = wait_for("node-0 initialised", LIMIT, || initialised(&nodes, "node-0")).await {
        panic!("{e}\n{}", ccm.log());
    }

    cluster.kill_apiserver();
    let down = Instant::now();
    let code = ccm.wait_exit(Duration::from_secs(60))?;
    let exited_after = down.elapsed();
    assert_eq!(
        code,
        Some(1),
        "the leader exits 1 when it cannot renew:\n{}",
        ccm.log()
    );
    assert!(ccm.log().contains("leaderelection lost"), "{}", ccm.log());
    assert!(
        exited_after >= Duration::from_secs(4),
        "not before the renew deadline (5 s, less one retry period): {exited_after:?}"
    );
    let took = cluster.start_apiserver().await?;
    let back = Instant::now();
    let ccm = rcp_e2e::ccm::CcmProcess::start(
        "fake-cloud-controller-manager",
        "ccm-b",
        cluster.kubeconfig_path(),
        cluster.dir(),
        &args,
    )?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    nodes
        .create(&PostParams::default(), &tainted_node("node-1"))
        .await?;
    wait_for("node-1 initialised by the restarted CCM", LIMIT, || {
        initialised(&nodes, "node-1")
    })
    .await?;
    println!(
        "outage > renew deadline: the leader exited {exited_after:.1?} after the API server died; API server back in {took:.1?}; a restarted CCM initialised a new Node {:.1?} later",
        back.elapsed()
    );
    drop(ccm);
    Ok(())
}

/// vCenter answering 30 % of the requests with SOAP faults, 503s, resets, delays and lost
/// answers: every Node is initialised all the same, and while the faults go on no Node is
/// deleted or tainted as shut down (doubt is never "gone" nor "off"), though the lifecycle
/// controller keeps checking them.
#[tokio::test]
async fn vsphere_nodes_initialise_and_none_is_deleted_or_tainted_under_30_percent_vcenter_faults()
-> Result<()> {
    use k8s_cloud_provider::{node::helpers::has_taint, well_known::TAINT_SHUTDOWN};
    use k8s_openapi::api::core::v1::Node;
    use kube::{Api, api::PostParams};
    use rcp_e2e::{
        fault_proxy::FaultProxy,
        k8s::{initialised, set_ready, tainted_node, wait_for},
        vcsim::small_model,
    };
    const N: usize = 4;
    let share: f64 = env_or("RCP_FAULT_SHARE", 0.3);
    let cluster = rcp_e2e::TestCluster::start().await?;
    let vcsim = rcp_e2e::Vcsim::start_with(small_model(N))?;
    vcsim.identify(N)?;
    let (cert, key) = vcsim.tls_files();
    let proxy = FaultProxy::start_tls(&format!("https://{}", vcsim.host_port()), &cert, &key).await?;
    let config = cluster.dir().join("vsphere.yaml");
    std::fs::write(&config, vcsim.cloud_config_yaml(proxy.port(), "")?)?;
    let ccm = rcp_e2e::ccm::CcmProcess::start(
        "cloud-controller-manager-vsphere",
        "ccm-vsphere-faults",
        cluster.kubeconfig_path(),
        cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--leader-elect=false".to_string(),
            "--node-monitor-period=1s".to_string(),
        ],
    )?;
    proxy.set_random_faults(Some(RandomFaults {
        share,
        kinds: FaultKind::ALL.to_vec(),
        only: vec![],
        api: FaultApi::Vsphere,
    }));
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    let start = Instant::now();
    for i in 0..N {
        nodes
            .create(&PostParams::default(), &tainted_node(&format!("node-{i}")))
            .await?;
    }
    for i in 0..N {
        let name = format!("node-{i}");
        if let Err(e) = wait_for(&format!("{name} initialised"), LIMIT, || {
            initialised(&nodes, &name)
        })
        .await
        {
            panic!("{e}; faults {:?}", proxy.faulted_by_kind());
        }
    }
    let took = start.elapsed();
    let lifecycle = "controller=\"cloud-node-lifecycle-controller\"";
    let passes = ["controller_reconcile_total{", lifecycle];
    let before = ccm.metric_sum(&passes).await;
    for i in 0..N {
        set_ready(&nodes, &format!("node-{i}"), "Unknown").await?;
    }
    let watch_until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < watch_until {
        for i in 0..N {
            let n = nodes.get_opt(&format!("node-{i}")).await?;
            let n = n.unwrap_or_else(|| panic!("node-{i} was deleted while its VM exists"));
            assert!(
                !has_taint(&n, TAINT_SHUTDOWN),
                "node-{i} tainted as shut down while its VM runs"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let checked = ccm.metric_sum(&passes).await - before;
    let requests = proxy.total();
    println!(
        "vCenter with {:.0} % faults: {N} Nodes initialised in {took:.1?}; {requests} requests, {} faulted ({:?}); {checked} lifecycle passes in 20 s, none deleted or tainted; {:.1} requests per lifecycle pass or initialisation",
        share * 100.0,
        proxy.faulted(),
        proxy.faulted_by_kind(),
        requests as f64 / (checked + N as f64).max(1.0),
    );
    assert!(
        checked >= 5.0,
        "the lifecycle controller kept checking ({checked} passes)"
    );
    assert!(share == 0.0 || proxy.faulted() > 0);
    Ok(())
}

/// The API server behind a proxy that answers a share (`RCP_API_FAULT_SHARE`, default 20 %) of
/// the CCM's requests other than watches with `429 TooManyRequests`, `500`, `503`, connection
/// resets, 0.5–2 s delays or lost answers (the write happened, the answer says 500), lease
/// renewals included: Nodes are initialised, Services get their load balancers and, deleted,
/// lose them and their finalizers; nothing panics and the process keeps its lease.
#[tokio::test]
async fn nodes_and_services_converge_under_random_api_server_faults() -> Result<()> {
    use k8s_openapi::api::core::v1::{Node, Service};
    use kube::{
        Api,
        api::{DeleteParams, PostParams},
    };
    use rcp_e2e::{
        fault_proxy::FaultProxy,
        k8s::{initialised, tainted_node, wait_for, wait_for_ingress},
    };
    const N: usize = 3;
    let share: f64 = env_or("RCP_API_FAULT_SHARE", 0.2);
    let cluster = rcp_e2e::TestCluster::start().await?;
    let proxy = FaultProxy::start_tls_self_signed(cluster.server()).await?;
    let proxied = cluster.kubeconfig_via_proxy(proxy.port())?;
    proxy.set_random_faults(Some(RandomFaults {
        share,
        kinds: FaultKind::ALL.to_vec(),
        only: vec![],
        api: FaultApi::Kube,
    }));
    let mut ccm = start_fake_ccm(
        &cluster,
        &proxied,
        "ccm-api-faults",
        N,
        &[
            // Renewals fail at the fault share too: a deadline of several retry periods keeps
            // a run of failed renewals (0.2^10) from costing the lease.
            "--leader-elect-lease-duration=30s",
            "--leader-elect-renew-deadline=20s",
        ],
    )?;
    let client = cluster.client().await?;
    let (nodes, services): (Api<Node>, Api<Service>) =
        (Api::all(client.clone()), Api::namespaced(client, "default"));
    let start = Instant::now();
    for i in 0..N {
        nodes
            .create(&PostParams::default(), &tainted_node(&format!("node-{i}")))
            .await?;
        services
            .create(&PostParams::default(), &lb_service(&format!("svc-{i}")))
            .await?;
    }
    for i in 0..N {
        let name = format!("node-{i}");
        if let Err(e) = wait_for(&format!("{name} initialised"), LIMIT, || {
            initialised(&nodes, &name)
        })
        .await
        {
            panic!("{e}; faults {:?}\n{}", proxy.faulted_by_kind(), ccm.log());
        }
        wait_for_ingress(&services, &format!("svc-{i}"), LIMIT).await?;
    }
    let provisioned = start.elapsed();
    for i in 0..N {
        services
            .delete(&format!("svc-{i}"), &DeleteParams::default())
            .await?;
    }
    for i in 0..N {
        let name = format!("svc-{i}");
        wait_for(&format!("{name} deleted (finalizer removed)"), LIMIT, || async {
            services.get_opt(&name).await.ok()?.is_none().then_some(())
        })
        .await?;
    }
    let took = start.elapsed();
    ccm.check_running()?;
    let panics = ccm.metric_value_read("controller_panics_total").await?;
    let log = ccm.log();
    println!(
        "API server with {:.0} % faults: {N} Nodes initialised and {N} Services provisioned in {provisioned:.1?}, deleted by {took:.1?}; {} requests through the proxy, {} faulted ({:?}); panics {panics}",
        share * 100.0,
        proxy.total(),
        proxy.faulted(),
        proxy.faulted_by_kind(),
    );
    assert_eq!(panics, 0.0, "no panic under API faults");
    assert!(!log.contains("leaderelection lost"), "the lease was lost:\n{log}");
    assert!(share == 0.0 || proxy.faulted() > 0, "faults were injected");
    Ok(())
}
