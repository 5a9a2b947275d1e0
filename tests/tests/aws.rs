//! `cloud-controller-manager-aws` as a real process against a real kube-apiserver and moto:
//! node initialisation, lifecycle, routes.

use std::time::Duration;

use anyhow::Result;
use k8s_cloud_provider::{
    node::helpers::{addresses, has_taint},
    well_known::{TAINT_SHUTDOWN, TAINT_UNINITIALIZED},
};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use rcp_e2e::{
    Moto, TestCluster,
    ccm::CcmProcess,
    fault_proxy::{Action, FaultProxy, Rule},
    k8s::{events_for, initialised, node_with_provider_id, set_ready, tainted_node, wait_for},
    moto::{Instance, World},
};

const T: Duration = Duration::from_secs(60);
const BIN: &str = "cloud-controller-manager-aws";

struct Env {
    cluster: TestCluster,
    moto: Moto,
    world: World,
    nodes: Api<Node>,
}

async fn env(instances: usize) -> Result<Env> {
    let cluster = TestCluster::start().await?;
    let moto = Moto::start().await?;
    let world = moto.build_world("e2e", instances).await?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    Ok(Env {
        cluster,
        moto,
        world,
        nodes,
    })
}

fn start_ccm(env: &Env, name: &str, extra: &[&str]) -> Result<CcmProcess> {
    let config = env.cluster.dir().join(format!("{name}-cloud.conf"));
    std::fs::write(&config, env.moto.cloud_config(&env.world))?;
    let mut args = vec![
        format!("--cloud-config={}", config.display()),
        "--leader-elect=false".to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    CcmProcess::start_with_env(
        BIN,
        name,
        &env.cluster.ccm_kubeconfig("aws/base")?,
        env.cluster.dir(),
        &args,
        &env.moto.sdk_env(),
    )
}

fn expected_addresses(i: &Instance) -> Vec<NodeAddress> {
    let a = |t: &str, v: &str| NodeAddress {
        type_: t.into(),
        address: v.into(),
    };
    let mut v = vec![a("InternalIP", &i.private_ip)];
    if let Some(ip) = &i.public_ip {
        v.push(a("ExternalIP", ip));
    }
    v.push(a("InternalDNS", &i.private_dns_name));
    v.push(a("Hostname", &i.private_dns_name));
    if let Some(dns) = &i.public_dns_name {
        v.push(a("ExternalDNS", dns));
    }
    v
}

#[tokio::test]
async fn nodes_named_by_private_dns_or_instance_id_are_initialised_from_ec2() -> Result<()> {
    let env = env(4).await?;
    let ccm = start_ccm(&env, "ccm-aws", &[])?;
    let (by_dns, by_id) = (&env.world.instances[..3], &env.world.instances[3]);
    for i in by_dns {
        env.nodes
            .create(&PostParams::default(), &tainted_node(&i.private_dns_name))
            .await?;
    }
    env.nodes
        .create(&PostParams::default(), &tainted_node(&by_id.id))
        .await?;

    for i in by_dns.iter().chain(std::iter::once(by_id)) {
        let name = if i.id == by_id.id {
            i.id.clone()
        } else {
            i.private_dns_name.clone()
        };
        let n = wait_for(&format!("{name} initialised"), T, || {
            initialised(&env.nodes, &name)
        })
        .await?;
        assert_eq!(
            n.spec.as_ref().unwrap().provider_id.as_deref(),
            Some(format!("aws:///{}/{}", i.zone, i.id).as_str())
        );
        let labels = n.metadata.labels.clone().unwrap_or_default();
        for (k, v) in [
            ("node.kubernetes.io/instance-type", i.instance_type.as_str()),
            ("beta.kubernetes.io/instance-type", i.instance_type.as_str()),
            ("topology.kubernetes.io/zone", i.zone.as_str()),
            ("failure-domain.beta.kubernetes.io/zone", i.zone.as_str()),
            ("topology.kubernetes.io/region", "us-east-1"),
            ("failure-domain.beta.kubernetes.io/region", "us-east-1"),
        ] {
            assert_eq!(labels.get(k).map(String::as_str), Some(v), "{name}: label {k}");
        }
        assert!(
            labels
                .get("topology.k8s.aws/zone-id")
                .is_some_and(|z| !z.is_empty()),
            "{name}: zone-id label: {labels:?}"
        );
        assert_eq!(
            addresses(&n),
            expected_addresses(i).as_slice(),
            "{name}: addresses in AWS-15 order"
        );
        assert!(!has_taint(&n, TAINT_UNINITIALIZED));
    }
    let zones: std::collections::BTreeSet<&str> =
        env.world.instances.iter().map(|i| i.zone.as_str()).collect();
    assert_eq!(zones.len(), 2, "instances span two zones");

    let metrics = ccm.metrics().await?;
    let calls: u64 = metrics
        .lines()
        .find(|l| {
            l.starts_with(
                "cloudprovider_aws_api_request_duration_seconds_count{request=\"describe_instances\"}",
            )
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .expect("describe_instances count in /metrics");
    println!("4 nodes initialised with {calls} DescribeInstances calls");
    assert!(calls <= 8, "look-ups are coalesced: {calls} calls for 4 nodes");
    Ok(())
}

const LIFECYCLE: &str = "controller=\"cloud-node-lifecycle-controller\"";

#[tokio::test]
async fn stopped_instances_taint_terminated_ones_delete_and_a_failing_ec2_deletes_nothing() -> Result<()> {
    let mut env = env(3).await?;
    let ccm = start_ccm(&env, "ccm-aws-lifecycle", &["--node-monitor-period=1s"])?;
    let names: Vec<String> = env
        .world
        .instances
        .iter()
        .map(|i| i.private_dns_name.clone())
        .collect();
    for n in &names {
        env.nodes.create(&PostParams::default(), &tainted_node(n)).await?;
    }
    for n in &names {
        wait_for("initialised", T, || initialised(&env.nodes, n)).await?;
    }
    let ec2 = env.moto.ec2();
    let (stopped, terminated, kept) = (&env.world.instances[0], &env.world.instances[1], &names[2]);

    // Stopped + NotReady → shutdown taint.
    ec2.stop_instances().instance_ids(&stopped.id).send().await?;
    set_ready(&env.nodes, &stopped.private_dns_name, "False").await?;
    wait_for("shutdown taint", T, || async {
        let n = env.nodes.get(&stopped.private_dns_name).await.ok()?;
        has_taint(&n, TAINT_SHUTDOWN).then_some(())
    })
    .await?;

    // Terminated + NotReady → Node deleted.
    ec2.terminate_instances()
        .instance_ids(&terminated.id)
        .send()
        .await?;
    set_ready(&env.nodes, &terminated.private_dns_name, "Unknown").await?;
    wait_for("terminated node deleted", T, || async {
        env.nodes
            .get_opt(&terminated.private_dns_name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await?;
    assert!(
        env.nodes.get_opt(&stopped.private_dns_name).await?.is_some(),
        "a stopped instance still exists"
    );

    // EC2 unreachable: nothing is deleted, whatever the node's state.
    let passes = ["controller_reconcile_total{", LIFECYCLE];
    let failed_calls = ["cloudprovider_api_calls_total{", LIFECYCLE, "result=\"error\""];
    let (passes_before, failed_before) = (ccm.metric_sum(&passes).await, ccm.metric_sum(&failed_calls).await);
    env.moto.stop();
    set_ready(&env.nodes, kept, "False").await?;
    tokio::time::sleep(Duration::from_secs(15)).await; // > cache TTL (10 s) + several monitor periods
    // Nothing deleted because the controller ran and EC2 failed, not because it did not run.
    let (passes_after, failed_after) = (ccm.metric_sum(&passes).await, ccm.metric_sum(&failed_calls).await);
    println!(
        "EC2 down 15 s: {} monitor passes, {} failed EC2 checks",
        passes_after - passes_before,
        failed_after - failed_before
    );
    assert!(
        passes_after - passes_before >= 5.0,
        "the lifecycle controller ran during the outage"
    );
    assert!(failed_after > failed_before, "and asked EC2, which failed");
    for n in [kept, &stopped.private_dns_name] {
        assert!(
            env.nodes.get_opt(n).await?.is_some(),
            "{n} must not be deleted while EC2 fails"
        );
    }
    Ok(())
}

/// The instance IDs a query-protocol `DescribeInstances` body names (`InstanceId.N=…`).
fn described_ids(body: &str) -> Vec<String> {
    body.split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| k.starts_with("InstanceId."))
        .map(|(_, v)| v.to_string())
        .collect()
}

/// The lifecycle controller asks about NotReady Nodes only, so its cache misses read ahead only
/// those: with one NotReady Node among Ready ones, its `DescribeInstances` name that Node's
/// instance and no other (before, every pass re-read every Node's instance once the 10-s cache
/// age had passed: 5000 instances every 10 s for one NotReady Node at 5000 Nodes).
#[tokio::test]
async fn a_not_ready_node_among_ready_ones_costs_a_describe_of_its_own_instance_only() -> Result<()> {
    let env = env(8).await?;
    for i in &env.world.instances {
        let node = node_with_provider_id(&i.private_dns_name, &i.provider_id());
        env.nodes.create(&PostParams::default(), &node).await?;
    }
    let (not_ready, ready) = env.world.instances.split_first().expect("8 instances");
    set_ready(&env.nodes, &not_ready.private_dns_name, "False").await?;
    for i in ready {
        set_ready(&env.nodes, &i.private_dns_name, "True").await?;
    }
    let _ccm = start_ccm(&env, "ccm-aws-read-ahead", &["--node-monitor-period=1s"])?;
    // The start: the address sync reads every instance (one read-ahead). After the 10-s cache
    // age only the lifecycle controller asks, every second, about the NotReady Node.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let from = env.moto.recorded().len();
    tokio::time::sleep(Duration::from_secs(12)).await;
    let describes: Vec<Vec<String>> = env.moto.requests()[from..]
        .iter()
        .filter(|b| b.contains("Action=DescribeInstances"))
        .map(|b| described_ids(b))
        .collect();
    println!("DescribeInstances in 12 s after the start: {describes:?}");
    assert!(
        !describes.is_empty(),
        "the lifecycle controller asked about the NotReady Node's instance"
    );
    for ids in &describes {
        assert_eq!(
            ids,
            &vec![not_ready.id.clone()],
            "only the NotReady Node's instance"
        );
    }
    Ok(())
}

#[tokio::test]
async fn routes_point_pod_cidrs_at_instances_and_follow_node_deletion() -> Result<()> {
    let env = env(3).await?;
    let _ccm = start_ccm(
        &env,
        "ccm-aws-routes",
        &[
            "--controllers=*,route",
            "--configure-cloud-routes=true",
            "--cluster-cidr=10.244.0.0/16",
            "--route-reconciliation-period=1s",
        ],
    )?;
    for (idx, i) in env.world.instances.iter().enumerate() {
        let mut n = tainted_node(&i.private_dns_name);
        let cidr = format!("10.244.{}.0/24", idx + 1);
        n.spec = Some(NodeSpec {
            pod_cidr: Some(cidr.clone()),
            pod_cidrs: Some(vec![cidr]),
            ..n.spec.unwrap()
        });
        env.nodes.create(&PostParams::default(), &n).await?;
    }
    let ec2 = env.moto.ec2();
    let routes = || async {
        let out = ec2
            .describe_route_tables()
            .route_table_ids(&env.world.route_table_id)
            .send()
            .await
            .ok()?;
        let map: std::collections::BTreeMap<String, String> = out.route_tables()[0]
            .routes()
            .iter()
            .filter_map(|r| {
                Some((
                    r.destination_cidr_block()?.to_string(),
                    r.instance_id()?.to_string(),
                ))
            })
            .collect();
        Some(map)
    };
    let want: std::collections::BTreeMap<String, String> = env
        .world
        .instances
        .iter()
        .enumerate()
        .map(|(idx, i)| (format!("10.244.{}.0/24", idx + 1), i.id.clone()))
        .collect();
    wait_for("three routes", T, || async {
        routes().await.filter(|r| *r == want)
    })
    .await?;
    // Source/destination check is off on the targets.
    let out = ec2
        .describe_instances()
        .instance_ids(&env.world.instances[0].id)
        .send()
        .await?;
    assert_eq!(
        out.reservations()[0].instances()[0].source_dest_check(),
        Some(false)
    );
    // The NetworkUnavailable condition says the routes exist. (The route controller may get
    // there before the cloud-node controller has set the provider ID: wait for both.)
    let n = wait_for("NetworkUnavailable=False and a provider ID", T, || async {
        let n = env
            .nodes
            .get(&env.world.instances[0].private_dns_name)
            .await
            .ok()?;
        let ok = n
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .any(|c| c.type_ == "NetworkUnavailable" && c.status == "False");
        let initialised = n.spec.as_ref()?.provider_id.is_some();
        (ok && initialised).then_some(n)
    })
    .await?;
    assert_eq!(
        n.spec.unwrap().provider_id.unwrap(),
        format!(
            "aws:///{}/{}",
            env.world.instances[0].zone, env.world.instances[0].id
        )
    );

    // The default route through the internet gateway is never touched; a deleted node's route goes.
    env.nodes
        .delete(&env.world.instances[2].private_dns_name, &DeleteParams::default())
        .await?;
    let mut left = want.clone();
    left.remove("10.244.3.0/24");
    wait_for("route of the deleted node removed", T, || async {
        routes().await.filter(|r| *r == left)
    })
    .await?;
    let out = ec2
        .describe_route_tables()
        .route_table_ids(&env.world.route_table_id)
        .send()
        .await?;
    assert!(
        out.route_tables()[0]
            .routes()
            .iter()
            .any(|r| r.destination_cidr_block() == Some("0.0.0.0/0") && r.gateway_id().is_some()),
        "the internet route is left alone"
    );
    Ok(())
}

/// A lost answer to a `CreateRoute` (the proxy forwards it to moto, then answers 500): the SDK's
/// retry is told `RouteAlreadyExists`, the route is found pointing at the asked instance, and
/// that is success — the Node's `NetworkUnavailable` is `False` after the first pass, no
/// `FailedToCreateRoute`. And the burst describes the table only to discover it, to list the
/// routes and for that one answer (upstream: once more per route created).
#[tokio::test]
async fn a_lost_create_route_answer_is_success_and_a_burst_describes_the_table_once() -> Result<()> {
    let env = env(3).await?;
    // The Nodes (initialised, with pod CIDRs) exist before the CCM starts, so that its first
    // route pass sees all three; the period is long enough that it is the only one.
    for (idx, i) in env.world.instances.iter().enumerate() {
        let mut n = i.node();
        let cidr = format!("10.244.{}.0/24", idx + 1);
        n.spec = Some(NodeSpec {
            pod_cidr: Some(cidr.clone()),
            pod_cidrs: Some(vec![cidr]),
            ..n.spec.unwrap_or_default()
        });
        env.nodes.create(&PostParams::default(), &n).await?;
    }
    let proxy = FaultProxy::start(env.moto.endpoint()).await?;
    proxy.add(
        Rule::new(
            &["Action=CreateRoute"],
            Action::LoseAnswer {
                status: 500,
                body: "<Response><Errors><Error><Code>InternalError</Code><Message>lost</Message></Error></Errors><RequestID>fault</RequestID></Response>".into(),
            },
        )
        .times(1),
    );
    let config = env.cluster.dir().join("routes-lost-cloud.conf");
    std::fs::write(
        &config,
        env.moto
            .cloud_config(&env.world)
            .replace(env.moto.endpoint(), &format!("http://127.0.0.1:{}", proxy.port())),
    )?;
    let ccm = CcmProcess::start_with_env(
        BIN,
        "ccm-aws-routes-lost",
        &env.cluster.ccm_kubeconfig("aws/base")?,
        env.cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--leader-elect=false".into(),
            "--controllers=*,route".into(),
            "--configure-cloud-routes=true".into(),
            "--cluster-cidr=10.244.0.0/16".into(),
            "--route-reconciliation-period=10m".into(),
        ],
        &env.moto.sdk_env(),
    )?;
    let names = env.world.node_names();
    wait_for(
        "NetworkUnavailable=False on every Node after one pass",
        T,
        || async {
            for name in &names {
                let n = env.nodes.get(name).await.ok()?;
                let created = n.status?.conditions?.iter().any(|c| {
                    c.type_ == "NetworkUnavailable"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("RouteCreated")
                });
                if !created {
                    return None;
                }
            }
            Some(())
        },
    )
    .await?;
    assert_eq!(proxy.faulted(), 1, "one CreateRoute answer was lost");
    let creates = env
        .moto
        .requests()
        .iter()
        .filter(|r| r.starts_with("Action=CreateRoute&") && r.contains("InstanceId="))
        .count();
    assert_eq!(creates, 4, "three routes, one of them sent twice");
    let client = env.cluster.client().await?;
    for name in &names {
        let events = events_for(&client, "default", name).await?;
        assert!(
            !events.iter().any(|(reason, ..)| reason == "FailedToCreateRoute"),
            "{name}: {events:?}"
        );
    }
    let describes = ccm
        .metric_value(
            "cloudprovider_aws_api_request_duration_seconds_count{request=\"describe_route_tables\"}",
        )
        .await;
    assert_eq!(
        describes, 3.0,
        "discovery, the pass's listing and the lost answer's check; none per route"
    );
    Ok(())
}

/// AWS-13: a Fargate node (`fargate-ip-…` provider ID) is answered from its network interface
/// — InternalIP/InternalDNS and the interface's zone — and never looked up with
/// `DescribeInstances`; it is deleted only once its interface is gone, and never tainted as
/// shut down while it exists (upstream's answer is inverted there).
#[tokio::test]
async fn fargate_nodes_are_answered_from_their_network_interface() -> Result<()> {
    let env = env(1).await?;
    let ccm = start_ccm(&env, "ccm-aws-fargate", &["--node-monitor-period=1s"])?;
    let ec2 = env.moto.ec2();
    let (zone, subnet) = env.world.subnets[0].clone();
    let eni = ec2
        .create_network_interface()
        .subnet_id(&subnet)
        .private_ip_address("10.0.0.77")
        .send()
        .await?
        .network_interface()
        .and_then(|n| n.network_interface_id())
        .unwrap_or_default()
        .to_string();
    let attachment = ec2
        .attach_network_interface()
        .network_interface_id(&eni)
        .instance_id(&env.world.instances[0].id)
        .device_index(1)
        .send()
        .await?
        .attachment_id()
        .unwrap_or_default()
        .to_string();
    let name = "fargate-ip-10-0-0-77.ec2.internal";
    let mut node = tainted_node(name);
    node.spec.get_or_insert_with(NodeSpec::default).provider_id = Some(format!("aws:///{zone}/{name}"));
    env.nodes.create(&PostParams::default(), &node).await?;
    let n = wait_for("fargate node initialised", T, || initialised(&env.nodes, name)).await?;
    let addrs = addresses(&n);
    assert!(
        addrs
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == "10.0.0.77"),
        "{addrs:?}"
    );
    let labels = n.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("topology.kubernetes.io/zone"), Some(&zone));

    // Not ready while its interface exists: neither deleted nor tainted as shut down.
    let passes = ["controller_reconcile_total{", LIFECYCLE];
    let before = ccm.metric_sum(&passes).await;
    set_ready(&env.nodes, name, "False").await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        ccm.metric_sum(&passes).await - before >= 2.0,
        "the lifecycle controller looked at it"
    );
    let n = env.nodes.get(name).await?;
    assert!(
        !has_taint(&n, TAINT_SHUTDOWN),
        "a running Fargate node is not shut down"
    );
    assert!(
        !env.moto
            .requests()
            .iter()
            .any(|b| b.contains("Action=DescribeInstances") && b.contains("fargate-")),
        "a Fargate ID never reaches DescribeInstances"
    );

    // Its interface gone: the Node goes.
    ec2.detach_network_interface()
        .attachment_id(&attachment)
        .send()
        .await?;
    ec2.delete_network_interface()
        .network_interface_id(&eni)
        .send()
        .await?;
    wait_for("fargate node deleted", T, || async {
        env.nodes.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await?;
    Ok(())
}

/// `[Global] RoleARN` + `SourceARN`: the CCM works with the assumed role's credentials, and its
/// AssumeRole request (to moto's STS through `[ServiceOverride]`) carries
/// `x-amz-source-account` (the role ARN's account) and `x-amz-source-arn`.
#[tokio::test]
async fn an_assumed_role_is_asked_for_with_the_source_headers() -> Result<()> {
    let env = env(1).await?;
    let config = env.cluster.dir().join("role-cloud.conf");
    let role = "arn:aws:iam::123456789012:role/ccm";
    let source = "arn:aws:eks:us-east-1:123456789012:cluster/e2e";
    let text = env.moto.cloud_config(&env.world).replacen(
        "[Global]\n",
        &format!("[Global]\nRoleARN = {role}\nSourceARN = {source}\n"),
        1,
    ) + &format!(
        "\n[ServiceOverride \"sts\"]\nService = sts\nRegion = us-east-1\nURL = {}\nSigningRegion = us-east-1\n",
        env.moto.endpoint()
    );
    std::fs::write(&config, text)?;
    let _ccm = CcmProcess::start_with_env(
        BIN,
        "ccm-aws-role",
        &env.cluster.ccm_kubeconfig("aws/base")?,
        env.cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--leader-elect=false".to_string(),
        ],
        &env.moto.sdk_env(),
    )?;
    let i = &env.world.instances[0];
    env.nodes
        .create(&PostParams::default(), &tainted_node(&i.private_dns_name))
        .await?;
    wait_for("initialised with the assumed role", T, || {
        initialised(&env.nodes, &i.private_dns_name)
    })
    .await?;
    let recorded = env.moto.recorded();
    let (headers, _) = recorded
        .iter()
        .find(|(_, body)| body.contains("Action=AssumeRole"))
        .expect("an AssumeRole request reached moto's STS");
    assert_eq!(
        headers.get("x-amz-source-account").map(String::as_str),
        Some("123456789012")
    );
    assert_eq!(headers.get("x-amz-source-arn").map(String::as_str), Some(source));
    // EC2 was called with the assumed role's credentials, not the static ones.
    // The last DescribeInstances is the CCM's (the test's own world building came first).
    let describe = recorded
        .iter()
        .rev()
        .find(|(_, body)| body.contains("Action=DescribeInstances"))
        .expect("a DescribeInstances");
    assert!(
        !describe
            .0
            .get("authorization")
            .is_some_and(|a| a.contains("AKIDTEST")),
        "EC2 calls are signed with the assumed role's credentials"
    );
    Ok(())
}
