//! AWS load balancers: `cloud-controller-manager-aws` as a real process on kube-apiserver and
//! moto, asserted on the moto resources.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use anyhow::Result;
use aws_sdk_ec2::types::Filter;
use k8s_cloud_provider::service::helpers::default_load_balancer_name;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use rcp_e2e::{
    Moto, TestCluster,
    ccm::CcmProcess,
    fault_proxy::{Action, FaultProxy, Rule},
    imds::{ImdsStub, SelfInstance},
    k8s::{
        events_for, ingress_hostname, load_balancer_service, register_tainted_nodes, tainted_node, wait_for,
        wait_for_event, wait_for_ingress,
    },
    moto::World,
};

const T: Duration = Duration::from_secs(90);
const PREFIX: &str = "service.beta.kubernetes.io/aws-load-balancer-";

struct Env {
    cluster: TestCluster,
    moto: Moto,
    world: World,
    nodes: Api<Node>,
    services: Api<Service>,
    /// EC2 resources tagged for the cluster before any Service existed (the world's own).
    tagged_at_start: BTreeSet<String>,
    /// The proxy between the CCM and moto, when asked for.
    proxy: Option<FaultProxy>,
    _imds: Option<ImdsStub>,
    _ccm: CcmProcess,
}

/// IDs of the EC2 resources tagged `kubernetes.io/cluster/e2e`.
async fn cluster_tagged(moto: &Moto) -> Result<BTreeSet<String>> {
    let out = moto
        .ec2()
        .describe_tags()
        .filters(
            Filter::builder()
                .name("key")
                .values("kubernetes.io/cluster/e2e")
                .build(),
        )
        .send()
        .await?;
    Ok(out
        .tags()
        .iter()
        .filter_map(|t| t.resource_id().map(str::to_string))
        .collect())
}

async fn env(instances: usize) -> Result<Env> {
    env_with(instances, "").await
}

/// Like [`env`], with `extra_global` (lines) added to the cloud config's `[Global]` section.
async fn env_with(instances: usize, extra_global: &str) -> Result<Env> {
    env_opts(
        instances,
        EnvOptions {
            extra_global,
            ..Default::default()
        },
    )
    .await
}

/// How the CCM of an [`Env`] is set up.
#[derive(Default)]
struct EnvOptions<'a> {
    /// Lines added to `[Global]`.
    extra_global: &'a str,
    /// No `VPC` / `SubnetID` in the config: the CCM finds its VPC through IMDS (a stub that
    /// answers as the world's first instance).
    vpc_from_imds: bool,
    /// The CCM reaches moto through a [`FaultProxy`].
    fault_proxy: bool,
}

async fn env_opts(instances: usize, o: EnvOptions<'_>) -> Result<Env> {
    let cluster = TestCluster::start().await?;
    let moto = Moto::start().await?;
    let world = moto.build_world("e2e", instances).await?;
    let config = cluster.dir().join("cloud.conf");
    let mut cloud_config =
        moto.cloud_config(&world)
            .replacen("[Global]\n", &format!("[Global]\n{}", o.extra_global), 1);
    let mut sdk_env: Vec<(String, String)> = moto
        .sdk_env()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut imds = None;
    if o.vpc_from_imds {
        cloud_config = cloud_config
            .lines()
            .filter(|l| !l.starts_with("VPC =") && !l.starts_with("SubnetID ="))
            .map(|l| format!("{l}\n"))
            .collect();
        let stub = ImdsStub::start(SelfInstance::of(&world, &world.instances[0])).await?;
        sdk_env.retain(|(k, _)| k != "AWS_EC2_METADATA_DISABLED");
        sdk_env.push(("AWS_EC2_METADATA_SERVICE_ENDPOINT".into(), stub.url()));
        imds = Some(stub);
    }
    let mut proxy = None;
    if o.fault_proxy {
        let p = FaultProxy::start(moto.endpoint()).await?;
        cloud_config = cloud_config.replace(moto.endpoint(), &format!("http://127.0.0.1:{}", p.port()));
        proxy = Some(p);
    }
    std::fs::write(&config, cloud_config)?;
    let env_refs: Vec<(&str, &str)> = sdk_env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let ccm = CcmProcess::start_with_env(
        "cloud-controller-manager-aws",
        "ccm-aws-lb",
        &cluster.ccm_kubeconfig("aws/base")?,
        cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--leader-elect=false".into(),
            "--cluster-name=e2e".into(),
        ],
        &env_refs,
    )?;
    let tagged_at_start = cluster_tagged(&moto).await?;
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    register_tainted_nodes(&nodes, &world.node_names(), Some(T)).await?;
    Ok(Env {
        services: Api::namespaced(client, "default"),
        cluster,
        moto,
        world,
        nodes,
        tagged_at_start,
        proxy,
        _imds: imds,
        _ccm: ccm,
    })
}

async fn ingress(services: &Api<Service>, name: &str) -> Result<Service> {
    wait_for_ingress(services, name, T).await
}

fn node_ports(s: &Service) -> Vec<i32> {
    s.spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .iter()
        .filter_map(|p| p.node_port)
        .collect()
}

/// Security groups other than the world's node group and the VPC's default group.
async fn extra_groups(env: &Env) -> Result<Vec<String>> {
    let out = env
        .moto
        .ec2()
        .describe_security_groups()
        .filters(Filter::builder().name("vpc-id").values(&env.world.vpc_id).build())
        .send()
        .await?;
    Ok(out
        .security_groups()
        .iter()
        .filter(|g| {
            g.group_id() != Some(env.world.security_group_id.as_str()) && g.group_name() != Some("default")
        })
        .filter_map(|g| g.group_name().map(str::to_string))
        .collect())
}

async fn node_group_refs(env: &Env) -> Result<(usize, Vec<String>)> {
    let out = env
        .moto
        .ec2()
        .describe_security_groups()
        .group_ids(&env.world.security_group_id)
        .send()
        .await?;
    let g = &out.security_groups()[0];
    let group_refs = g
        .ip_permissions()
        .iter()
        .flat_map(|p| p.user_id_group_pairs())
        .count();
    let described: Vec<String> = g
        .ip_permissions()
        .iter()
        .flat_map(|p| p.ip_ranges())
        .filter_map(|r| r.description().map(str::to_string))
        .collect();
    Ok((group_refs, described))
}

/// Creates a security group in the world's VPC the way a user would for the
/// `security-groups` annotation (not tagged for the cluster); returns its ID.
async fn user_group(env: &Env, name: &str) -> Result<String> {
    let out = env
        .moto
        .ec2()
        .create_security_group()
        .group_name(name)
        .description("brought by the user")
        .vpc_id(&env.world.vpc_id)
        .send()
        .await?;
    Ok(out.group_id().unwrap_or_default().to_string())
}

/// Asserts that the user's group `id` still has no rules: a BYO group is never edited.
async fn assert_user_group_untouched(env: &Env, id: &str) -> Result<()> {
    let out = env
        .moto
        .ec2()
        .describe_security_groups()
        .group_ids(id)
        .send()
        .await?;
    let group = out
        .security_groups()
        .first()
        .expect("the user's group still exists");
    assert!(cidr_rules(group).is_empty(), "the BYO group {id} was edited");
    Ok(())
}

/// Deletes the Service `name` and waits until it is gone, i.e. until the service controller
/// has finished deleting its load balancer and removed the finalizer.
async fn delete_service(env: &Env, name: &str) -> Result<()> {
    env.services.delete(name, &DeleteParams::default()).await?;
    wait_for(&format!("service {name} gone"), T, || async {
        env.services.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nCCM log (last lines, newest first):\n{}", ccm_tail(env)))
}

/// Creates the Classic-ELB Service `svc` (port 80), waits for its load balancer and returns the
/// load balancer's name and the ID of its own `k8s-elb-<name>` group.
async fn classic_with_group(env: &Env, svc: &str) -> Result<(String, String)> {
    env.services
        .create(
            &PostParams::default(),
            &load_balancer_service(svc, &[], &[(80, "http")]),
        )
        .await?;
    let s = ingress(&env.services, svc).await?;
    let name = default_load_balancer_name(&s);
    let group = env
        .moto
        .ec2()
        .describe_security_groups()
        .filters(
            Filter::builder()
                .name("group-name")
                .values(format!("k8s-elb-{name}"))
                .build(),
        )
        .send()
        .await?
        .security_groups()
        .first()
        .and_then(|g| g.group_id())
        .unwrap_or_default()
        .to_string();
    Ok((name, group))
}

/// EC2 tags for a resource of `kind` made by a test.
fn tag_spec(
    kind: aws_sdk_ec2::types::ResourceType,
    tags: &[(&str, &str)],
) -> aws_sdk_ec2::types::TagSpecification {
    let mut b = aws_sdk_ec2::types::TagSpecification::builder().resource_type(kind);
    for (k, v) in tags {
        b = b.tags(aws_sdk_ec2::types::Tag::builder().key(*k).value(*v).build());
    }
    b.build()
}

/// The CCM's last 40 log lines, newest first.
fn ccm_tail(env: &Env) -> String {
    let log = env._ccm.log();
    log.lines().rev().take(40).collect::<Vec<_>>().join("\n")
}

/// `(protocol, from, to, cidr)` of every CIDR ingress rule of `g`, sorted.
fn cidr_rules(g: &aws_sdk_ec2::types::SecurityGroup) -> Vec<(String, i32, i32, String)> {
    let mut rules: Vec<(String, i32, i32, String)> = g
        .ip_permissions()
        .iter()
        .flat_map(|p| {
            p.ip_ranges().iter().map(move |r| {
                (
                    p.ip_protocol().unwrap_or_default().to_string(),
                    p.from_port().unwrap_or(-1),
                    p.to_port().unwrap_or(-1),
                    r.cidr_ip().unwrap_or_default().to_string(),
                )
            })
        })
        .collect();
    rules.sort();
    rules
}

async fn nothing_left(env: &Env) -> Result<()> {
    let left = || async {
        let clbs = env.moto.elb().describe_load_balancers().send().await.ok()?;
        let nlbs = env.moto.elbv2().describe_load_balancers().send().await.ok()?;
        let tgs = env.moto.elbv2().describe_target_groups().send().await.ok()?;
        Some(
            clbs.load_balancer_descriptions()
                .iter()
                .filter_map(|l| l.load_balancer_name())
                .chain(
                    nlbs.load_balancers()
                        .iter()
                        .filter_map(|l| l.load_balancer_name()),
                )
                .chain(tgs.target_groups().iter().filter_map(|t| t.target_group_name()))
                .map(str::to_string)
                .collect::<Vec<_>>(),
        )
    };
    if let Err(e) = wait_for("no load balancer left", T, || async {
        left().await.filter(|l| l.is_empty()).map(|_| ())
    })
    .await
    {
        anyhow::bail!(
            "{e}: left {:?}; moto was asked {:?}",
            left().await,
            env.moto.actions()
        );
    }
    assert!(
        extra_groups(env).await?.is_empty(),
        "security groups left: {:?}",
        extra_groups(env).await?
    );
    let (refs, described) = node_group_refs(env).await?;
    assert_eq!(refs, 0, "the node group still references a load-balancer group");
    assert!(
        described
            .iter()
            .all(|d| !d.starts_with("kubernetes.io/rule/nlb/")),
        "NLB rules left on the node group: {described:?}"
    );
    // moto keeps the tags of a deleted security group, route table or subnet, so one counts as left
    // over only while it still exists; instances are the tests' own (added nodes); any other new
    // tagged resource is a leftover.
    let mut left = Vec::new();
    for id in cluster_tagged(&env.moto)
        .await?
        .difference(&env.tagged_at_start)
        .filter(|id| !id.starts_with("i-"))
    {
        let table_exists = || async {
            env.moto
                .ec2()
                .describe_route_tables()
                .route_table_ids(id)
                .send()
                .await
                .is_ok_and(|o| !o.route_tables().is_empty())
        };
        if id.starts_with("rtb-") {
            if table_exists().await {
                left.push(id.clone());
            }
            continue;
        }
        if id.starts_with("subnet-") {
            let exists = env
                .moto
                .ec2()
                .describe_subnets()
                .subnet_ids(id)
                .send()
                .await
                .is_ok_and(|o| !o.subnets().is_empty());
            if exists {
                left.push(id.clone());
            }
            continue;
        }
        let exists = !id.starts_with("sg-")
            || env
                .moto
                .ec2()
                .describe_security_groups()
                .group_ids(id)
                .send()
                .await
                .is_ok_and(|o| !o.security_groups().is_empty());
        if exists {
            left.push(id.clone());
        }
    }
    assert!(
        left.is_empty(),
        "EC2 resources tagged for the cluster besides the world's own: {left:?}"
    );
    Ok(())
}

#[tokio::test]
async fn classic_elb_with_annotations_follows_nodes_and_leaves_nothing_behind() -> Result<()> {
    let env = env(3).await?;
    let mut svc = load_balancer_service(
        "web",
        &[
            ("additional-resource-tags", "team=web,cost-center=42"),
            ("healthcheck-healthy-threshold", "3"),
            ("healthcheck-interval", "15"),
            ("healthcheck-timeout", "4"),
            ("connection-idle-timeout", "120"),
            ("cross-zone-load-balancing-enabled", "true"),
            ("proxy-protocol", "*"),
        ],
        &[(80, "http")],
    );
    svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["10.0.0.0/8".into()]);
    env.services.create(&PostParams::default(), &svc).await?;
    let svc = ingress(&env.services, "web").await?;
    let name = default_load_balancer_name(&svc);
    let node_port = node_ports(&svc)[0];

    let elb = env.moto.elb();
    let d = elb
        .describe_load_balancers()
        .load_balancer_names(&name)
        .send()
        .await?;
    let lb = &d.load_balancer_descriptions()[0];
    assert_eq!(
        ingress_hostname(&svc).as_deref(),
        lb.dns_name(),
        "status hostname is the ELB's DNS name"
    );
    let l = lb.listener_descriptions()[0].listener().unwrap();
    assert_eq!(
        (
            l.protocol(),
            l.load_balancer_port(),
            l.instance_protocol(),
            l.instance_port()
        ),
        ("TCP", 80, Some("TCP"), node_port)
    );
    let hc = lb.health_check().expect("health check configured");
    assert_eq!(
        (
            hc.target(),
            hc.healthy_threshold(),
            hc.unhealthy_threshold(),
            hc.interval(),
            hc.timeout()
        ),
        (format!("TCP:{node_port}").as_str(), 3, 6, 15, 4)
    );
    assert_eq!(lb.instances().len(), 3);
    assert_eq!(lb.scheme(), Some("internet-facing"));
    let subnets: std::collections::BTreeSet<&str> = lb.subnets().iter().map(String::as_str).collect();
    assert_eq!(
        subnets,
        env.world.subnets.iter().map(|s| s.1.as_str()).collect(),
        "one public subnet per zone"
    );
    let attrs = elb
        .describe_load_balancer_attributes()
        .load_balancer_name(&name)
        .send()
        .await?;
    let a = attrs.load_balancer_attributes().unwrap();
    assert_eq!(a.connection_settings().map(|c| c.idle_timeout()), Some(120));
    assert_eq!(a.cross_zone_load_balancing().map(|c| c.enabled()), Some(true));
    let tags = elb.describe_tags().load_balancer_names(&name).send().await?;
    let tags: BTreeMap<String, String> = tags.tag_descriptions()[0]
        .tags()
        .iter()
        .map(|t| (t.key().to_string(), t.value().unwrap_or_default().to_string()))
        .collect();
    assert_eq!(tags.get("team").map(String::as_str), Some("web"));
    assert_eq!(
        tags.get("kubernetes.io/cluster/e2e").map(String::as_str),
        Some("owned")
    );
    assert_eq!(
        tags.get("kubernetes.io/service-name").map(String::as_str),
        Some("default/web")
    );
    let policies = elb
        .describe_load_balancer_policies()
        .load_balancer_name(&name)
        .send()
        .await?;
    assert!(
        policies
            .policy_descriptions()
            .iter()
            .any(|p| p.policy_name() == Some("k8s-proxyprotocol-enabled"))
    );

    // The ELB's own group: exactly port 80 and ICMP 3/4 from the source range.
    let ec2 = env.moto.ec2();
    let g = ec2
        .describe_security_groups()
        .filters(
            Filter::builder()
                .name("group-name")
                .values(format!("k8s-elb-{name}"))
                .build(),
        )
        .send()
        .await?;
    let g = &g.security_groups()[0];
    assert_eq!(lb.security_groups(), [g.group_id().unwrap().to_string()]);
    assert_eq!(
        cidr_rules(g),
        vec![
            ("icmp".into(), 3, 4, "10.0.0.0/8".into()),
            ("tcp".into(), 80, 80, "10.0.0.0/8".into())
        ]
    );
    assert_eq!(
        node_group_refs(&env).await?.0,
        1,
        "nodes accept traffic from the ELB's group"
    );

    let events = wait_for_event(&env.cluster.client().await?, "default", "web", T, |reason, _| {
        reason == "EnsuredLoadBalancer"
    })
    .await?;
    assert!(events.iter().any(|e| e.0 == "EnsuringLoadBalancer"), "{events:?}");

    // A node joins, then one leaves: the instances follow.
    let more = env.moto.run_instances(&env.world, 1).await?;
    env.nodes
        .create(&PostParams::default(), &tainted_node(&more[0].private_dns_name))
        .await?;
    wait_for("4 instances", T, || async {
        let d = elb
            .describe_load_balancers()
            .load_balancer_names(&name)
            .send()
            .await
            .ok()?;
        (d.load_balancer_descriptions()[0].instances().len() == 4).then_some(())
    })
    .await?;
    env.nodes
        .delete(&env.world.instances[0].private_dns_name, &DeleteParams::default())
        .await?;
    wait_for("3 instances", T, || async {
        let d = elb
            .describe_load_balancers()
            .load_balancer_names(&name)
            .send()
            .await
            .ok()?;
        let ids: Vec<&str> = d.load_balancer_descriptions()[0]
            .instances()
            .iter()
            .filter_map(|i| i.instance_id())
            .collect();
        (ids.len() == 3 && !ids.contains(&env.world.instances[0].id.as_str())).then_some(())
    })
    .await?;

    env.services.delete("web", &DeleteParams::default()).await?;
    wait_for("service gone", T, || async {
        env.services.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await?;
    nothing_left(&env).await
}

#[tokio::test]
async fn nlb_with_target_groups_targets_and_node_rules_and_a_type_switch_leave_nothing() -> Result<()> {
    let env = env(3).await?;
    // Only nodes labelled role=web are targets.
    for i in &env.world.instances[..2] {
        env.nodes
            .patch(
                &i.private_dns_name,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({"metadata": {"labels": {"role": "web"}}})),
            )
            .await?;
    }
    env.services
        .create(
            &PostParams::default(),
            &load_balancer_service(
                "api",
                &[
                    ("type", "nlb"),
                    ("target-node-labels", "role=web"),
                    ("internal", "true"),
                ],
                &[(80, "http"), (8443, "admin")],
            ),
        )
        .await?;
    let svc = ingress(&env.services, "api").await?;
    let name = default_load_balancer_name(&svc);
    let v2 = env.moto.elbv2();
    let lb = v2.describe_load_balancers().names(&name).send().await?;
    let lb = &lb.load_balancers()[0];
    assert_eq!(ingress_hostname(&svc).as_deref(), lb.dns_name());
    assert_eq!(lb.scheme().map(|s| s.as_str()), Some("internal"));
    let arn = lb.load_balancer_arn().unwrap();
    let listeners = v2.describe_listeners().load_balancer_arn(arn).send().await?;
    let mut ports: Vec<i32> = listeners.listeners().iter().filter_map(|l| l.port()).collect();
    ports.sort();
    assert_eq!(ports, vec![80, 8443]);
    let tgs = v2.describe_target_groups().load_balancer_arn(arn).send().await?;
    assert_eq!(tgs.target_groups().len(), 2);
    let wanted_targets: std::collections::BTreeSet<String> =
        env.world.instances[..2].iter().map(|i| i.id.clone()).collect();
    for tg in tgs.target_groups() {
        assert!(
            tg.target_group_name().unwrap().starts_with("k8s-default-api-"),
            "{:?}",
            tg.target_group_name()
        );
        assert!(
            node_ports(&svc).contains(&tg.port().unwrap()),
            "target groups use the NodePorts"
        );
        assert_eq!(tg.health_check_protocol().map(|p| p.as_str()), Some("TCP"));
        let health = v2
            .describe_target_health()
            .target_group_arn(tg.target_group_arn().unwrap())
            .send()
            .await?;
        let ids: std::collections::BTreeSet<String> = health
            .target_health_descriptions()
            .iter()
            .filter_map(|d| d.target().and_then(|t| t.id().map(str::to_string)))
            .collect();
        assert_eq!(ids, wanted_targets, "targets follow target-node-labels");
    }
    // A third node gets the label: it becomes a target of every target group.
    let third = &env.world.instances[2];
    env.nodes
        .patch(
            &third.private_dns_name,
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"labels": {"role": "web"}}})),
        )
        .await?;
    wait_for("3 targets per target group", T, || async {
        let tgs = v2
            .describe_target_groups()
            .load_balancer_arn(arn)
            .send()
            .await
            .ok()?;
        for tg in tgs.target_groups() {
            let h = v2
                .describe_target_health()
                .target_group_arn(tg.target_group_arn()?)
                .send()
                .await
                .ok()?;
            if h.target_health_descriptions().len() != 3 {
                return None;
            }
        }
        Some(())
    })
    .await?;
    let (_, described) = node_group_refs(&env).await?;
    assert!(
        described
            .iter()
            .any(|d| d == &format!("kubernetes.io/rule/nlb/client={name}")),
        "{described:?}"
    );
    assert!(
        described.iter().any(|d| d == "kubernetes.io/rule/nlb/mtu"),
        "{described:?}"
    );

    // NLB → Classic ELB (annotation removed): the NLB and its target groups go.
    env.services
        .patch(
            "api",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"annotations": {format!("{PREFIX}type"): null}}})),
        )
        .await?;
    // The NLB goes once the status shows the classic ELB; its target groups right after it.
    wait_for(
        "classic ELB exists, the NLB and its target groups are gone",
        T,
        || async {
            let clb = env
                .moto
                .elb()
                .describe_load_balancers()
                .load_balancer_names(&name)
                .send()
                .await
                .ok()?;
            let nlbs = v2.describe_load_balancers().send().await.ok()?;
            let tgs = v2.describe_target_groups().send().await.ok()?;
            (!clb.load_balancer_descriptions().is_empty()
                && nlbs.load_balancers().is_empty()
                && tgs.target_groups().is_empty())
            .then_some(())
        },
    )
    .await?;
    // Classic ELB → ClusterIP: everything goes.
    env.services.patch("api", &PatchParams::default(), &Patch::Merge(&serde_json::json!({"spec": {"type": "ClusterIP", "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": null}, {"name": "admin", "port": 8443, "protocol": "TCP", "nodePort": null}]}}))).await?;
    nothing_left(&env).await
}

#[tokio::test]
async fn tls_internal_and_health_check_annotations_reach_the_elb() -> Result<()> {
    let env = env(2).await?;
    let cert = env.moto.acm_certificate("secure.example.com")?;
    let cert = cert.as_str();
    env.services
        .create(
            &PostParams::default(),
            &load_balancer_service(
                "secure",
                &[
                    ("ssl-cert", cert),
                    ("ssl-ports", "https"),
                    ("backend-protocol", "http"),
                    ("internal", "true"),
                    ("healthcheck-protocol", "HTTP"),
                    ("healthcheck-path", "/ready"),
                ],
                &[(80, "http"), (443, "https")],
            ),
        )
        .await?;
    let svc = match tokio::time::timeout(T, ingress(&env.services, "secure")).await {
        Ok(s) => s?,
        Err(_) => anyhow::bail!(
            "no ingress; events: {:?}",
            events_for(&env.cluster.client().await?, "default", "secure").await?
        ),
    };
    let name = default_load_balancer_name(&svc);
    let d = env
        .moto
        .elb()
        .describe_load_balancers()
        .load_balancer_names(&name)
        .send()
        .await?;
    let lb = &d.load_balancer_descriptions()[0];
    assert_eq!(lb.scheme(), Some("internal"));
    // moto 5.2.5 reports every listener's InstanceProtocol as its Protocol (it ignores the one
    // sent), so only the front end is asserted here; the HTTPS→HTTP mapping is unit-tested
    // (lb::classic::tests::listener_protocols_follow_aws_34).
    let mut listeners: Vec<(i32, String, Option<String>)> = lb
        .listener_descriptions()
        .iter()
        .filter_map(|d| d.listener())
        .map(|l| {
            (
                l.load_balancer_port(),
                l.protocol().to_string(),
                l.ssl_certificate_id().map(str::to_string),
            )
        })
        .collect();
    listeners.sort();
    assert_eq!(
        listeners,
        vec![
            (80, "HTTP".into(), None),
            (443, "HTTPS".into(), Some(cert.into()))
        ]
    );
    let first_node_port = node_ports(&svc)[0];
    assert_eq!(
        lb.health_check().map(|h| h.target()),
        Some(format!("HTTP:{first_node_port}/ready").as_str())
    );
    Ok(())
}

#[tokio::test]
async fn an_invalid_annotation_is_a_warning_and_changes_nothing() -> Result<()> {
    let env = env(1).await?;
    env.services
        .create(
            &PostParams::default(),
            &load_balancer_service("bad", &[("healthcheck-interval", "2")], &[(80, "http")]),
        )
        .await?;
    let client = env.cluster.client().await?;
    let ev = wait_for("SyncLoadBalancerFailed", T, || async {
        events_for(&client, "default", "bad")
            .await
            .ok()?
            .into_iter()
            .find(|e| e.0 == "SyncLoadBalancerFailed")
    })
    .await?;
    assert!(
        ev.1.contains("service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval: \"2\" is invalid"),
        "{ev:?}"
    );
    assert!(
        env.moto
            .elb()
            .describe_load_balancers()
            .send()
            .await?
            .load_balancer_descriptions()
            .is_empty(),
        "nothing created"
    );
    assert!(extra_groups(&env).await?.is_empty(), "no security group created");
    // Fixing the annotation creates the load balancer.
    env.services.patch("bad", &PatchParams::default(), &Patch::Merge(&serde_json::json!({"metadata": {"annotations": {format!("{PREFIX}healthcheck-interval"): "20"}}}))).await?;
    ingress(&env.services, "bad").await?;
    Ok(())
}

#[tokio::test]
async fn switching_classic_to_nlb_to_cluster_ip_leaves_nothing() -> Result<()> {
    let env = env(2).await?;
    env.services
        .create(
            &PostParams::default(),
            &load_balancer_service("flip", &[], &[(80, "http")]),
        )
        .await?;
    let svc = ingress(&env.services, "flip").await?;
    let name = default_load_balancer_name(&svc);
    assert_eq!(extra_groups(&env).await?, vec![format!("k8s-elb-{name}")]);
    // Classic → NLB: the classic ELB, its group and the node rule referencing it go.
    env.services
        .patch(
            "flip",
            &PatchParams::default(),
            &Patch::Merge(
                &serde_json::json!({"metadata": {"annotations": {format!("{PREFIX}type"): "nlb"}}}),
            ),
        )
        .await?;
    let v2 = env.moto.elbv2();
    // The classic ELB goes first, its group right after it (the same deletion).
    wait_for(
        "the NLB exists and the classic ELB and its group are gone",
        T,
        || async {
            let nlb = v2.describe_load_balancers().names(&name).send().await.ok()?;
            let clbs = env.moto.elb().describe_load_balancers().send().await.ok()?;
            let groups = extra_groups(&env).await.ok()?;
            (!nlb.load_balancers().is_empty()
                && clbs.load_balancer_descriptions().is_empty()
                && groups.is_empty())
            .then_some(())
        },
    )
    .await?;
    assert_eq!(
        node_group_refs(&env).await?.0,
        0,
        "no node rule references the deleted group"
    );
    let svc = wait_for("status shows the NLB", T, || async {
        let s = env.services.get("flip").await.ok()?;
        let nlb = v2.describe_load_balancers().names(&name).send().await.ok()?;
        (ingress_hostname(&s).as_deref() == nlb.load_balancers()[0].dns_name()).then_some(s)
    })
    .await?;
    assert!(ingress_hostname(&svc).is_some());
    // NLB → ClusterIP: everything goes.
    env.services.patch("flip", &PatchParams::default(), &Patch::Merge(&serde_json::json!({"spec": {"type": "ClusterIP", "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": null}]}}))).await?;
    nothing_left(&env).await
}

/// Descriptions of the node group's ICMP 3/4 (path-MTU) rules from `cidr`.
async fn mtu_rules(env: &Env, cidr: &str) -> Result<Vec<String>> {
    let out = env
        .moto
        .ec2()
        .describe_security_groups()
        .group_ids(&env.world.security_group_id)
        .send()
        .await?;
    Ok(out.security_groups()[0]
        .ip_permissions()
        .iter()
        .filter(|p| p.ip_protocol() == Some("icmp") && p.from_port() == Some(3) && p.to_port() == Some(4))
        .flat_map(|p| p.ip_ranges())
        .filter(|r| r.cidr_ip() == Some(cidr))
        .map(|r| r.description().unwrap_or_default().to_string())
        .collect())
}

/// EC2 keeps one ICMP 3/4 rule for two NLBs that take clients from the same CIDR. As upstream,
/// it is described `kubernetes.io/rule/nlb/mtu` and exists while any NLB has a client rule
/// from that CIDR in the group: deleting one NLB keeps it for the other; a rule in the form of
/// earlier versions of this provider (`…/mtu=<name>`) is taken over, not doubled.
#[tokio::test]
async fn two_nlbs_share_the_path_mtu_rule_and_deleting_one_keeps_it_for_the_other() -> Result<()> {
    let env = env(2).await?;
    for svc in ["first", "second"] {
        env.services
            .create(
                &PostParams::default(),
                &load_balancer_service(svc, &[("type", "nlb")], &[(80, "http")]),
            )
            .await?;
    }
    for svc in ["first", "second"] {
        ingress(&env.services, svc).await?;
    }
    let rules = mtu_rules(&env, "0.0.0.0/0").await?;
    assert_eq!(
        rules,
        ["kubernetes.io/rule/nlb/mtu"],
        "one rule, upstream's description"
    );

    // An earlier version's description is re-described on the next sync.
    env.moto
        .ec2()
        .update_security_group_rule_descriptions_ingress()
        .group_id(&env.world.security_group_id)
        .ip_permissions(
            aws_sdk_ec2::types::IpPermission::builder()
                .ip_protocol("icmp")
                .from_port(3)
                .to_port(4)
                .ip_ranges(
                    aws_sdk_ec2::types::IpRange::builder()
                        .cidr_ip("0.0.0.0/0")
                        .description("kubernetes.io/rule/nlb/mtu=aold")
                        .build(),
                )
                .build(),
        )
        .send()
        .await?;
    env.services.delete("first", &DeleteParams::default()).await?;
    let v2 = env.moto.elbv2();
    wait_for("the first NLB is gone", T, || async {
        let nlbs = v2.describe_load_balancers().send().await.ok()?;
        (nlbs.load_balancers().len() == 1).then_some(())
    })
    .await?;
    // Deletion of the first NLB recomputes the group's path-MTU rules: still needed.
    let rules = wait_for("the path-MTU rule in upstream's form", T, || async {
        let r = mtu_rules(&env, "0.0.0.0/0").await.ok()?;
        (r == ["kubernetes.io/rule/nlb/mtu"]).then_some(r)
    })
    .await?;
    assert_eq!(rules.len(), 1, "the remaining NLB keeps its path-MTU rule");

    env.services.delete("second", &DeleteParams::default()).await?;
    nothing_left(&env).await?;
    assert!(mtu_rules(&env, "0.0.0.0/0").await?.is_empty());
    Ok(())
}

/// `NLBSecurityGroupMode = Managed`: the NLB gets its own group with the client rules, the node
/// group admits the clients and health checks by CIDR (as upstream, in every mode), and
/// deletion removes both.
#[tokio::test]
async fn managed_nlb_security_group_is_attached_referenced_and_deleted() -> Result<()> {
    let env = env_with(2, "NLBSecurityGroupMode = Managed\n").await?;
    let mut svc = load_balancer_service("guarded", &[("type", "nlb")], &[(80, "http")]);
    svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["10.1.0.0/16".into()]);
    env.services.create(&PostParams::default(), &svc).await?;
    let svc = ingress(&env.services, "guarded").await?;
    let name = default_load_balancer_name(&svc);
    let v2 = env.moto.elbv2();
    let lb = v2.describe_load_balancers().names(&name).send().await?;
    let groups = lb.load_balancers()[0].security_groups().to_vec();
    assert_eq!(groups.len(), 1, "the NLB has the managed group: {groups:?}");
    let out = env
        .moto
        .ec2()
        .describe_security_groups()
        .group_ids(&groups[0])
        .send()
        .await?;
    let g = &out.security_groups()[0];
    assert!(
        g.group_name().unwrap().starts_with("k8s-default-guarded-"),
        "{:?}",
        g.group_name()
    );
    assert_eq!(
        cidr_rules(g),
        vec![
            ("icmp".to_string(), 3, 4, "10.1.0.0/16".to_string()),
            ("tcp".to_string(), 80, 80, "10.1.0.0/16".to_string()),
        ]
    );
    assert_eq!(
        extra_groups(&env).await?,
        vec![g.group_name().unwrap().to_string()]
    );
    // The nodes admit the clients and the health checks by CIDR in this mode too, as
    // upstream does (no rule naming the managed group).
    let (refs, described) = node_group_refs(&env).await?;
    assert_eq!(refs, 0, "no node rule names the managed group: {described:?}");
    assert!(
        described.contains(&format!("kubernetes.io/rule/nlb/client={name}"))
            && described.contains(&format!("kubernetes.io/rule/nlb/health={name}")),
        "client and health rules on the node group: {described:?}"
    );

    // Switching to a bring-your-own group: it is attached, the managed group is detached,
    // unreferenced and deleted, and the BYO group itself is never edited.
    let byo = user_group(&env, "byo-nlb").await?;
    let managed_name = g.group_name().unwrap().to_string();
    env.services
        .patch(
            "guarded",
            &PatchParams::default(),
            &Patch::Merge(
                &serde_json::json!({"metadata": {"annotations": {format!("{PREFIX}security-groups"): byo}}}),
            ),
        )
        .await?;
    wait_for("the NLB carries the BYO group only", T, || async {
        let lb = v2.describe_load_balancers().names(&name).send().await.ok()?;
        (lb.load_balancers()[0].security_groups() == [byo.clone()]).then_some(())
    })
    .await?;
    wait_for("the managed group is deleted", T, || async {
        let left = extra_groups(&env).await.ok()?;
        (left == ["byo-nlb"]).then_some(())
    })
    .await?;
    assert!(!extra_groups(&env).await?.contains(&managed_name));
    assert_user_group_untouched(&env, &byo).await?;

    env.services.delete("guarded", &DeleteParams::default()).await?;
    wait_for("the NLB is gone", T, || async {
        let nlbs = v2.describe_load_balancers().send().await.ok()?;
        nlbs.load_balancers().is_empty().then_some(())
    })
    .await?;
    assert_eq!(
        extra_groups(&env).await?,
        ["byo-nlb"],
        "a BYO group is never deleted"
    );
    let (refs, described) = node_group_refs(&env).await?;
    assert_eq!(refs, 0, "no node rule names a group: {described:?}");
    assert!(
        described.iter().all(|d| !d.ends_with(&format!("={name}"))),
        "the NLB's client and health rules went with it: {described:?}"
    );
    env.moto
        .ec2()
        .delete_security_group()
        .group_id(&byo)
        .send()
        .await?;
    nothing_left(&env).await
}

/// Two Classic ELBs given the same bring-your-own group: the node rule admitting it stays
/// until the last of them is deleted, and the group itself is never edited or deleted.
#[tokio::test]
async fn a_shared_byo_group_keeps_node_access_until_its_last_load_balancer_goes() -> Result<()> {
    let env = env(2).await?;
    let byo = user_group(&env, "byo-shared").await?;
    for svc in ["one", "two"] {
        env.services
            .create(
                &PostParams::default(),
                &load_balancer_service(svc, &[("security-groups", &byo)], &[(80, "http")]),
            )
            .await?;
    }
    for svc in ["one", "two"] {
        let s = ingress(&env.services, svc).await?;
        let lb = env
            .moto
            .elb()
            .describe_load_balancers()
            .load_balancer_names(default_load_balancer_name(&s))
            .send()
            .await?;
        assert_eq!(
            lb.load_balancer_descriptions()[0].security_groups(),
            std::slice::from_ref(&byo)
        );
    }
    assert_eq!(
        extra_groups(&env).await?,
        ["byo-shared"],
        "no k8s-elb group is made"
    );
    assert_eq!(
        node_group_refs(&env).await?.0,
        1,
        "the node group admits the BYO group"
    );

    delete_service(&env, "one").await?;
    let lbs = env.moto.elb().describe_load_balancers().send().await?;
    assert_eq!(lbs.load_balancer_descriptions().len(), 1);
    assert_eq!(
        node_group_refs(&env).await?.0,
        1,
        "the other ELB still reaches the nodes through the shared group"
    );

    delete_service(&env, "two").await?;
    assert_eq!(
        node_group_refs(&env).await?.0,
        0,
        "the last ELB took the node rule along"
    );
    assert_user_group_untouched(&env, &byo).await?;
    env.moto
        .ec2()
        .delete_security_group()
        .group_id(&byo)
        .send()
        .await?;
    nothing_left(&env).await
}

/// Issue 12 item 1: a config naming no VPC (and no subnet), a cluster with one tagged route
/// table per zone: the VPC comes from the CCM's own instance (IMDS), a Classic ELB is made in
/// it and deleted with everything it owned.
#[tokio::test]
async fn without_a_vpc_in_the_config_the_vpc_comes_from_imds_and_lbs_are_made_and_deleted() -> Result<()> {
    let env = env_opts(
        2,
        EnvOptions {
            vpc_from_imds: true,
            ..Default::default()
        },
    )
    .await?;
    // A second cluster-tagged route table (kops makes one per zone).
    let second_table = env
        .moto
        .ec2()
        .create_route_table()
        .vpc_id(&env.world.vpc_id)
        .tag_specifications(tag_spec(
            aws_sdk_ec2::types::ResourceType::RouteTable,
            &[("kubernetes.io/cluster/e2e", "owned")],
        ))
        .send()
        .await?
        .route_table()
        .and_then(|t| t.route_table_id())
        .unwrap_or_default()
        .to_string();
    env.services
        .create(
            &PostParams::default(),
            &load_balancer_service("novpc", &[], &[(80, "http")]),
        )
        .await?;
    let s = ingress(&env.services, "novpc").await?;
    let name = default_load_balancer_name(&s);
    let elb = env
        .moto
        .elb()
        .describe_load_balancers()
        .load_balancer_names(&name)
        .send()
        .await?;
    let elb = &elb.load_balancer_descriptions()[0];
    assert_eq!(elb.vpc_id(), Some(env.world.vpc_id.as_str()));
    let world_subnets: BTreeSet<&str> = env.world.subnets.iter().map(|(_, s)| s.as_str()).collect();
    assert!(elb.subnets().iter().all(|s| world_subnets.contains(s.as_str())));
    assert_eq!(extra_groups(&env).await?, [format!("k8s-elb-{name}")]);
    delete_service(&env, "novpc").await?;
    env.moto
        .ec2()
        .delete_route_table()
        .route_table_id(&second_table)
        .send()
        .await?;
    nothing_left(&env).await
}

/// Issue 12 item 3: a certificate rotation changes the NLB's TLS listener in place
/// (`ModifyListener`, same ARN); a TCP→TLS switch on one port is asked of EC2 as a
/// `ModifyListener` of the existing listener too, never a second listener on the port
/// (`DuplicateListener`) nor a delete and re-create. moto 5.2.5 refuses `Protocol=TLS` in
/// `ModifyListener` and keeps the certificate of a non-HTTPS listener (AWS does neither), so
/// the test checks the requests moto received, and that the listener stays the one it was.
#[tokio::test]
async fn nlb_listeners_change_in_place_for_tls_and_certificate_rotation() -> Result<()> {
    let env = env(2).await?;
    let (cert1, cert2) = (
        env.moto.acm_certificate("one.example.com")?,
        env.moto.acm_certificate("two.example.com")?,
    );
    env.services
        .create(
            &PostParams::default(),
            &load_balancer_service(
                "rotate",
                &[("type", "nlb"), ("ssl-cert", &cert1)],
                &[(443, "https")],
            ),
        )
        .await?;
    let v2 = env.moto.elbv2();
    let listener_of = |svc: Service| {
        let v2 = v2.clone();
        async move {
            let name = default_load_balancer_name(&svc);
            let lb = v2.describe_load_balancers().names(&name).send().await.ok()?;
            let arn = lb.load_balancers().first()?.load_balancer_arn()?.to_string();
            let out = v2
                .describe_listeners()
                .load_balancer_arn(&arn)
                .send()
                .await
                .ok()?;
            (out.listeners().len() == 1).then(|| out.listeners()[0].clone())
        }
    };
    let rotate = ingress(&env.services, "rotate").await?;
    let first = wait_for("the TLS listener", T, || listener_of(rotate.clone())).await?;
    assert_eq!(first.protocol().map(|p| p.as_str()), Some("TLS"));
    let before = env.moto.actions().len();
    env.services
        .patch(
            "rotate",
            &PatchParams::default(),
            &Patch::Merge(
                &serde_json::json!({"metadata": {"annotations": {format!("{PREFIX}ssl-cert"): &cert2}}}),
            ),
        )
        .await?;
    let encode = |arn: &str| arn.replace(':', "%3A").replace('/', "%2F");
    let modify_asked = |listener: String, needle: String| {
        let moto = &env.moto;
        async move {
            moto.requests()
                .iter()
                .any(|b| b.contains("Action=ModifyListener") && b.contains(&listener) && b.contains(&needle))
                .then_some(())
        }
    };
    let first_arn = encode(first.listener_arn().unwrap_or_default());
    wait_for(
        "a ModifyListener of the TLS listener to the new certificate",
        T,
        || modify_asked(first_arn.clone(), encode(&cert2)),
    )
    .await?;
    let after = wait_for("one listener", T, || listener_of(rotate.clone())).await?;
    assert_eq!(
        after.listener_arn(),
        first.listener_arn(),
        "same listener, changed in place"
    );

    let re_created = |from: usize| {
        let actions = env.moto.actions()[from..].to_vec();
        assert!(
            !actions
                .iter()
                .any(|a| a == "CreateListener" || a == "DeleteListener"),
            "listeners are changed in place, never re-created: {actions:?}"
        );
    };
    re_created(before);

    // TCP → TLS on the same port.
    env.services
        .create(
            &PostParams::default(),
            &load_balancer_service("plain", &[("type", "nlb")], &[(443, "https")]),
        )
        .await?;
    let plain = ingress(&env.services, "plain").await?;
    let tcp = wait_for("the TCP listener", T, || listener_of(plain.clone())).await?;
    let before = env.moto.actions().len();
    env.services
        .patch(
            "plain",
            &PatchParams::default(),
            &Patch::Merge(
                &serde_json::json!({"metadata": {"annotations": {format!("{PREFIX}ssl-cert"): &cert1}}}),
            ),
        )
        .await?;
    let tcp_arn = encode(tcp.listener_arn().unwrap_or_default());
    wait_for("a ModifyListener of the TCP listener to TLS", T, || {
        modify_asked(tcp_arn.clone(), "Protocol=TLS".into())
    })
    .await?;
    re_created(before);
    delete_service(&env, "rotate").await?;
    delete_service(&env, "plain").await?;
    nothing_left(&env).await
}

/// Issue 12 item 4: a Classic ELB → NLB switch whose NLB cannot be made (one EIP allocation for
/// two subnets) leaves the Classic ELB serving and the status on it, with a Warning saying so;
/// fixed, the NLB is made, the status moves to it, then the Classic ELB and its group go.
#[tokio::test]
async fn a_type_switch_that_fails_keeps_the_old_load_balancer_serving() -> Result<()> {
    let env = env(2).await?;
    env.services
        .create(
            &PostParams::default(),
            &load_balancer_service("switch", &[], &[(80, "http")]),
        )
        .await?;
    let s = ingress(&env.services, "switch").await?;
    let clb_host = ingress_hostname(&s).expect("hostname");
    let name = default_load_balancer_name(&s);
    env.services
        .patch(
            "switch",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"annotations": {
                format!("{PREFIX}type"): "nlb",
                format!("{PREFIX}eip-allocations"): "eipalloc-0123456789abcdef0",
            }}})),
        )
        .await?;
    let client = env.cluster.client().await?;
    wait_for("a warning that the classic ELB keeps serving", T, || async {
        let events = events_for(&client, "default", "switch").await.ok()?;
        events
            .iter()
            .any(|(reason, msg, _)| reason == "SyncLoadBalancerFailed" && msg.contains("keeps serving"))
            .then_some(())
    })
    .await?;
    let elb = env
        .moto
        .elb()
        .describe_load_balancers()
        .load_balancer_names(&name)
        .send()
        .await?;
    assert_eq!(
        elb.load_balancer_descriptions().len(),
        1,
        "the classic ELB still serves"
    );
    assert!(
        env.moto
            .elbv2()
            .describe_load_balancers()
            .send()
            .await?
            .load_balancers()
            .is_empty()
    );
    let s = env.services.get("switch").await?;
    assert_eq!(
        ingress_hostname(&s).as_deref(),
        Some(clb_host.as_str()),
        "status unchanged"
    );

    env.services
        .patch(
            "switch",
            &PatchParams::default(),
            &Patch::Merge(
                &serde_json::json!({"metadata": {"annotations": {format!("{PREFIX}eip-allocations"): null}}}),
            ),
        )
        .await?;
    let v2 = env.moto.elbv2();
    let nlb_host = wait_for("the status moves to the NLB", T, || async {
        let s = env.services.get("switch").await.ok()?;
        let host = ingress_hostname(&s)?;
        let nlbs = v2.describe_load_balancers().names(&name).send().await.ok()?;
        (nlbs.load_balancers().first()?.dns_name() == Some(host.as_str())).then_some(host)
    })
    .await?;
    assert_ne!(nlb_host, clb_host);
    wait_for("the classic ELB and its group are gone", T, || async {
        let clbs = env.moto.elb().describe_load_balancers().send().await.ok()?;
        let groups = extra_groups(&env).await.ok()?;
        (clbs.load_balancer_descriptions().is_empty() && groups.is_empty()).then_some(())
    })
    .await?;
    delete_service(&env, "switch").await?;
    nothing_left(&env).await
}

/// Issue 12 item 5: a user's group (not tagged for the cluster) that admits a cluster load
/// balancer's group is never modified, not even when that load balancer goes.
#[tokio::test]
async fn a_users_group_referencing_a_cluster_lb_group_is_never_modified() -> Result<()> {
    let env = env(2).await?;
    let (_, lb_group) = classic_with_group(&env, "refd").await?;
    let ec2 = env.moto.ec2();
    let user = user_group(&env, "user-db").await?;
    ec2.authorize_security_group_ingress()
        .group_id(&user)
        .ip_permissions(
            aws_sdk_ec2::types::IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(5432)
                .to_port(5432)
                .user_id_group_pairs(
                    aws_sdk_ec2::types::UserIdGroupPair::builder()
                        .group_id(&lb_group)
                        .build(),
                )
                .build(),
        )
        .send()
        .await?;
    let before = ec2
        .describe_security_groups()
        .group_ids(&user)
        .send()
        .await?
        .security_groups()[0]
        .ip_permissions()
        .to_vec();
    delete_service(&env, "refd").await?;
    let after = ec2
        .describe_security_groups()
        .group_ids(&user)
        .send()
        .await?
        .security_groups()[0]
        .ip_permissions()
        .to_vec();
    assert_eq!(before, after, "the user's group was modified");
    env.moto
        .ec2()
        .delete_security_group()
        .group_id(&user)
        .send()
        .await?;
    nothing_left(&env).await
}

/// Target groups of an NLB whose target groups were made before a listener that could not be
/// (a certificate moto does not know): found again by their tags and deleted with the Service.
#[tokio::test]
async fn target_groups_of_a_failed_listener_are_swept_on_delete() -> Result<()> {
    let env = env(2).await?;
    env.services
        .create(
            &PostParams::default(),
            &load_balancer_service(
                "badcert",
                &[
                    ("type", "nlb"),
                    (
                        "ssl-cert",
                        "arn:aws:acm:us-east-1:123456789012:certificate/00000000-0000-0000-0000-000000000000",
                    ),
                ],
                &[(443, "https")],
            ),
        )
        .await?;
    let v2 = env.moto.elbv2();
    wait_for("a target group without a listener", T, || async {
        let tgs = v2.describe_target_groups().send().await.ok()?;
        (tgs.target_groups().len() == 1 && tgs.target_groups()[0].load_balancer_arns().is_empty())
            .then_some(())
    })
    .await?;
    delete_service(&env, "badcert").await?;
    nothing_left(&env).await
}

/// A replaced target group whose deletion fails (`ResourceInUse`, injected by a proxy between
/// the CCM and moto) is found again by its tags: the Service's deletion keeps its finalizer
/// while a target group of it is still in use, and completes, leaving nothing, once it is not.
#[tokio::test]
async fn a_target_group_that_cannot_be_deleted_yet_is_swept_later() -> Result<()> {
    let env = env_opts(
        2,
        EnvOptions {
            fault_proxy: true,
            ..Default::default()
        },
    )
    .await?;
    let proxy = env.proxy.as_ref().expect("proxy");
    env.services
        .create(
            &PostParams::default(),
            &load_balancer_service("inuse", &[("type", "nlb")], &[(80, "http")]),
        )
        .await?;
    ingress(&env.services, "inuse").await?;
    proxy.add(Rule::new(
        &["Action=DeleteTargetGroup"],
        Action::Respond {
            status: 400,
            body: "<ErrorResponse xmlns=\"http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/\"><Error><Type>Sender</Type><Code>ResourceInUse</Code><Message>Target group is currently in use by a listener or a rule</Message></Error><RequestId>fault</RequestId></ErrorResponse>".into(),
        },
    ));
    // A new health-check interval names a new target group; the listener moves to it and the
    // old one cannot be deleted.
    env.services
        .patch(
            "inuse",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"annotations": {format!("{PREFIX}healthcheck-interval"): "10"}}})),
        )
        .await?;
    let v2 = env.moto.elbv2();
    wait_for("the old target group is left behind, detached", T, || async {
        let tgs = v2.describe_target_groups().send().await.ok()?;
        (tgs.target_groups().len() == 2
            && tgs
                .target_groups()
                .iter()
                .filter(|t| t.load_balancer_arns().is_empty())
                .count()
                == 1)
            .then_some(())
    })
    .await?;
    let failed = [
        "controller_reconcile_total{",
        "controller=\"service-lb-controller\"",
        "result=\"error\"",
    ];
    let failed_before = env._ccm.metric_sum(&failed).await;
    env.services.delete("inuse", &DeleteParams::default()).await?;
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(
        env._ccm.metric_sum(&failed).await > failed_before,
        "the deletion was attempted and failed"
    );
    assert!(
        env.services.get_opt("inuse").await?.is_some(),
        "the Service keeps its finalizer while its target groups cannot be deleted"
    );
    proxy.clear();
    wait_for("service inuse gone", T, || async {
        env.services.get_opt("inuse").await.ok()?.is_none().then_some(())
    })
    .await?;
    nothing_left(&env).await
}

/// A lost answer to the NLB's `CreateLoadBalancer` (the proxy forwards it, then answers 500)
/// is not re-sent by the SDK: moto, unlike AWS, is not idempotent by name and would make a
/// second NLB that outlives the Service (CI once leaked one under random faults). The CCM's
/// next sync finds the NLB the lost call made and completes it; one NLB, one create, and the
/// Service's deletion leaves nothing, even with a second NLB of the same name.
#[tokio::test]
async fn a_lost_create_answer_makes_no_second_nlb() -> Result<()> {
    let env = env_opts(
        2,
        EnvOptions {
            fault_proxy: true,
            ..Default::default()
        },
    )
    .await?;
    let proxy = env.proxy.as_ref().expect("proxy");
    proxy.add(
        Rule::new(
            &["Action=CreateLoadBalancer", "Type=network"],
            Action::LoseAnswer {
                status: 500,
                body: "<ErrorResponse><Error><Type>Receiver</Type><Code>InternalFailure</Code><Message>lost</Message></Error><RequestId>fault</RequestId></ErrorResponse>".into(),
            },
        )
        .times(1),
    );
    env.services
        .create(
            &PostParams::default(),
            &load_balancer_service("twice", &[("type", "nlb")], &[(80, "http")]),
        )
        .await?;
    ingress(&env.services, "twice").await?;
    assert_eq!(proxy.faulted(), 1, "the first answer was lost");
    let creates = env
        .moto
        .actions()
        .iter()
        .filter(|a| *a == "CreateLoadBalancer")
        .count();
    assert_eq!(creates, 1, "CreateLoadBalancer was sent once");
    let v2 = env.moto.elbv2();
    let lbs = v2.describe_load_balancers().send().await?;
    assert_eq!(lbs.load_balancers().len(), 1, "{lbs:?}");
    let listeners = v2
        .describe_listeners()
        .load_balancer_arn(lbs.load_balancers()[0].load_balancer_arn().unwrap_or_default())
        .send()
        .await?;
    assert_eq!(listeners.listeners().len(), 1, "{listeners:?}");
    // A second NLB of that name (what a re-sent create made in moto before): the deletion
    // deletes by name until the name finds nothing.
    let first = &lbs.load_balancers()[0];
    v2.create_load_balancer()
        .name(first.load_balancer_name().unwrap_or_default())
        .r#type(aws_sdk_elasticloadbalancingv2::types::LoadBalancerTypeEnum::Network)
        .set_subnets(Some(
            first
                .availability_zones()
                .iter()
                .filter_map(|z| z.subnet_id().map(str::to_string))
                .collect(),
        ))
        .send()
        .await?;
    env.services.delete("twice", &DeleteParams::default()).await?;
    wait_for("service twice gone", T, || async {
        env.services.get_opt("twice").await.ok()?.is_none().then_some(())
    })
    .await?;
    nothing_left(&env).await
}

/// Throttling the SDK retried is still throttling: every throttled attempt (not only the call's
/// final error) counts for the region's shared back-off and
/// `cloudprovider_aws_api_throttled_requests_total{operation_name}` (AWS operation names, as
/// upstream).
#[tokio::test]
async fn every_throttled_attempt_counts_not_only_the_final_error() -> Result<()> {
    let env = env_opts(
        1,
        EnvOptions {
            fault_proxy: true,
            ..Default::default()
        },
    )
    .await?;
    let proxy = env.proxy.as_ref().expect("proxy");
    proxy.add(Rule::new(
        &["Action=DescribeLoadBalancers"],
        Action::Respond {
            status: 400,
            body: "<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error><RequestId>fault</RequestId></ErrorResponse>".into(),
        },
    ));
    env.services
        .create(
            &PostParams::default(),
            &load_balancer_service("slow", &[], &[(80, "http")]),
        )
        .await?;
    let throttled =
        r#"cloudprovider_aws_api_throttled_requests_total{operation_name="DescribeLoadBalancers"}"#;
    let failed = r#"cloudprovider_aws_api_request_errors{request="elbv2_describe_load_balancers"}"#;
    let (t, f) = wait_for("throttled attempts counted", T, || async {
        let (t, f) = (
            env._ccm.metric_value(throttled).await,
            env._ccm.metric_value(failed).await,
        );
        (f >= 1.0 && t >= 3.0 * f).then_some((t, f))
    })
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}; proxy faulted {}; CCM log:\n{}",
            proxy.faulted(),
            ccm_tail(&env)
        )
    })?;
    assert!(t >= 3.0, "{t} throttled attempts for {f} failed calls");
    assert!(
        proxy.faulted() as f64 >= t,
        "every counted attempt reached the proxy ({} faulted, {t} counted)",
        proxy.faulted()
    );
    // The shared back-off saw them: the region's requests now wait.
    wait_for("the shared back-off inserts a delay", T, || async {
        env._ccm
            .log()
            .contains("Inserting delay before AWS request")
            .then_some(())
    })
    .await?;
    Ok(())
}

/// A `subnets` annotation naming a `Name` tag that two subnets carry is an error naming both
/// (upstream only counts), and nothing is made.
#[tokio::test]
async fn an_ambiguous_subnet_name_is_an_error_naming_the_subnets() -> Result<()> {
    let env = env(1).await?;
    let (zone, _) = env.world.subnets[0].clone();
    let twin = env
        .moto
        .ec2()
        .create_subnet()
        .vpc_id(&env.world.vpc_id)
        .availability_zone(&zone)
        .cidr_block("10.0.32.0/20")
        .tag_specifications(tag_spec(
            aws_sdk_ec2::types::ResourceType::Subnet,
            &[("Name", "shared-name")],
        ))
        .send()
        .await?
        .subnet()
        .and_then(|s| s.subnet_id())
        .unwrap_or_default()
        .to_string();
    env.moto
        .ec2()
        .create_tags()
        .resources(&env.world.subnets[0].1)
        .tags(
            aws_sdk_ec2::types::Tag::builder()
                .key("Name")
                .value("shared-name")
                .build(),
        )
        .send()
        .await?;
    env.services
        .create(
            &PostParams::default(),
            &load_balancer_service("twins", &[("subnets", "shared-name")], &[(80, "http")]),
        )
        .await?;
    let client = env.cluster.client().await?;
    let msg = wait_for("an error naming both subnets", T, || async {
        let events = events_for(&client, "default", "twins").await.ok()?;
        events
            .into_iter()
            .find(|(reason, msg, _)| reason == "SyncLoadBalancerFailed" && msg.contains("ambiguous"))
            .map(|(_, msg, _)| msg)
    })
    .await?;
    assert!(
        msg.contains(&twin) && msg.contains(&env.world.subnets[0].1),
        "{msg}"
    );
    assert!(
        env.moto
            .elb()
            .describe_load_balancers()
            .send()
            .await?
            .load_balancer_descriptions()
            .is_empty()
    );
    env.moto.ec2().delete_subnet().subnet_id(&twin).send().await?;
    Ok(())
}

/// A load-balancer group whose cluster tag says `shared` is used as it is: never re-tagged
/// `owned` (nor any other tag rewritten), and never deleted with its load balancer.
#[tokio::test]
async fn a_shared_tag_is_never_rewritten_and_a_shared_group_never_deleted() -> Result<()> {
    let env = env(1).await?;
    let (_, group) = classic_with_group(&env, "sharing").await?;
    let ec2 = env.moto.ec2();
    ec2.create_tags()
        .resources(&group)
        .tags(
            aws_sdk_ec2::types::Tag::builder()
                .key("kubernetes.io/cluster/e2e")
                .value("shared")
                .build(),
        )
        .tags(
            aws_sdk_ec2::types::Tag::builder()
                .key("team")
                .value("payments")
                .build(),
        )
        .send()
        .await?;
    let before = env.moto.actions().len();
    // A re-sync (annotation change) sees the group again.
    env.services
        .patch(
            "sharing",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"annotations": {format!("{PREFIX}connection-idle-timeout"): "120"}}})),
        )
        .await?;
    wait_for("the re-sync", T, || async {
        env.moto.actions()[before..]
            .iter()
            .any(|a| a == "ModifyLoadBalancerAttributes")
            .then_some(())
    })
    .await?;
    let tags = |g: aws_sdk_ec2::types::SecurityGroup| -> BTreeMap<String, String> {
        g.tags()
            .iter()
            .filter_map(|t| Some((t.key()?.to_string(), t.value()?.to_string())))
            .collect()
    };
    let g = ec2
        .describe_security_groups()
        .group_ids(&group)
        .send()
        .await?
        .security_groups()[0]
        .clone();
    let t = tags(g);
    assert_eq!(
        t.get("kubernetes.io/cluster/e2e").map(String::as_str),
        Some("shared")
    );
    assert_eq!(t.get("team").map(String::as_str), Some("payments"));
    delete_service(&env, "sharing").await?;
    let left = ec2.describe_security_groups().group_ids(&group).send().await?;
    assert_eq!(
        left.security_groups().len(),
        1,
        "a shared group is not the cluster's to delete"
    );
    ec2.delete_security_group().group_id(&group).send().await?;
    nothing_left(&env).await
}

/// A subnet replaced within a zone (a better one appears: the role tag) is detached from the
/// Classic ELB before its successor is attached — an ELB has one subnet per zone — and the ELB
/// never loses its last subnet.
#[tokio::test]
async fn a_classic_elb_subnet_replaced_in_its_zone_is_detached_before_the_new_one_is_attached() -> Result<()>
{
    let env = env(1).await?;
    env.services
        .create(
            &PostParams::default(),
            &load_balancer_service("moving", &[], &[(80, "http")]),
        )
        .await?;
    let s = ingress(&env.services, "moving").await?;
    let name = default_load_balancer_name(&s);
    let (zone, old) = env.world.subnets[0].clone();
    let ec2 = env.moto.ec2();
    let new = ec2
        .create_subnet()
        .vpc_id(&env.world.vpc_id)
        .availability_zone(&zone)
        .cidr_block("10.0.48.0/20")
        .tag_specifications(tag_spec(
            aws_sdk_ec2::types::ResourceType::Subnet,
            &[
                ("kubernetes.io/cluster/e2e", "shared"),
                ("kubernetes.io/role/elb", "1"),
            ],
        ))
        .send()
        .await?
        .subnet()
        .and_then(|s| s.subnet_id())
        .unwrap_or_default()
        .to_string();
    ec2.associate_route_table()
        .route_table_id(&env.world.route_table_id)
        .subnet_id(&new)
        .send()
        .await?;
    // Annotation changes re-sync the Service; the VPC's subnets are re-read after 60 s.
    let before = env.moto.actions().len();
    let n = std::sync::atomic::AtomicUsize::new(0);
    let (env_ref, name_ref, new_ref, n_ref) = (&env, &name, &new, &n);
    let elb = wait_for("the ELB in the new subnet", Duration::from_secs(150), || async move {
        let k = n_ref.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let patch = serde_json::json!({"metadata": {"annotations": {format!("{PREFIX}additional-resource-tags"): format!("sync={k}")}}});
        env_ref
            .services
            .patch("moving", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .ok()?;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let out = env_ref
            .moto
            .elb()
            .describe_load_balancers()
            .load_balancer_names(name_ref)
            .send()
            .await
            .ok()?;
        let elb = out.load_balancer_descriptions().first()?.clone();
        elb.subnets().contains(new_ref).then_some(elb)
    })
    .await?;
    assert!(!elb.subnets().contains(&old), "{:?}", elb.subnets());
    let actions = env.moto.actions()[before..].to_vec();
    let detach = actions.iter().position(|a| a == "DetachLoadBalancerFromSubnets");
    let attach = actions.iter().position(|a| a == "AttachLoadBalancerToSubnets");
    assert!(
        detach.is_some() && detach < attach,
        "detach before attach: {actions:?}"
    );
    delete_service(&env, "moving").await?;
    ec2.delete_subnet().subnet_id(&new).send().await?;
    nothing_left(&env).await
}
