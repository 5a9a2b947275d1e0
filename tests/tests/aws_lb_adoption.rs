//! A cluster that comes from the Go AWS provider: its Classic ELB, NLB (target group,
//! listener, node rules) and security groups are made beforehand exactly as the Go code names,
//! tags and configures them (with the AWS SDK, call by call as `cloud-provider-aws` makes
//! them), then `cloud-controller-manager-aws` starts as a real process. Its first sync must adopt
//! everything: not one mutating call in moto's request log, the same ARNs and IDs.

use std::time::Duration;

use anyhow::{Context, Result};
use aws_sdk_ec2::types::{IpPermission, IpRange, ResourceType, Tag, TagSpecification, UserIdGroupPair};
use aws_sdk_elasticloadbalancing::types::{
    AccessLog, ConnectionDraining, ConnectionSettings, CrossZoneLoadBalancing, HealthCheck,
    Instance as ElbInstance, Listener as ElbListener, LoadBalancerAttributes, Tag as ElbTag,
};
use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, LoadBalancerAttribute, LoadBalancerTypeEnum, ProtocolEnum, SubnetMapping,
    Tag as V2Tag, TargetDescription, TargetTypeEnum,
};
use k8s_cloud_provider::service::helpers::default_load_balancer_name;
use k8s_openapi::api::core::v1::{Node, NodeSpec, Service};
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
};
use rcp_e2e::{
    Moto, TestCluster,
    ccm::CcmProcess,
    k8s::{ingress_hostname, load_balancer_service, set_ready, wait_for_ingress},
    moto::World,
};
use sha1::Digest as _;

const T: Duration = Duration::from_secs(90);
const CLUSTER: &str = "e2e";

/// What upstream's `buildTargetGroupName` names a target group: SHA-1 over the fields written
/// one after another (written out here independently of the provider's own code).
fn go_target_group_name(ns: &str, name: &str, port: i32, node_port: i32) -> String {
    let mut h = sha1::Sha1::new();
    for part in [
        CLUSTER,
        ns,
        name,
        &port.to_string(),
        &node_port.to_string(),
        "TCP",
        "instance",
        "TCP",
        "30",
    ] {
        h.update(part.as_bytes());
    }
    let clean = |s: &str| {
        s.chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(8)
            .collect::<String>()
    };
    format!(
        "k8s-{}-{}-{}",
        clean(ns),
        clean(name),
        &hex::encode(h.finalize())[..10]
    )
}

fn node_port(s: &Service) -> i32 {
    s.spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|p| p[0].node_port)
        .unwrap_or_default()
}

/// Mutating API actions (anything but Describe*/Get*/List*).
fn mutating(actions: &[String]) -> Vec<String> {
    actions
        .iter()
        .filter(|a| !(a.starts_with("Describe") || a.starts_with("Get") || a.starts_with("List")))
        .cloned()
        .collect()
}

/// The Go provider's Classic ELB for `svc`: `k8s-elb-<name>` with its port and ICMP 3/4 rules,
/// the ELB with cluster and service tags, upstream's default health check and attributes, the
/// instances, and the node group's "all traffic from the ELB group" rule.
async fn go_classic(moto: &Moto, world: &World, svc: &Service) -> Result<(String, String)> {
    let name = default_load_balancer_name(svc);
    let key = "default/legacy-clb";
    let ec2 = moto.ec2();
    let sg = ec2
        .create_security_group()
        .group_name(format!("k8s-elb-{name}"))
        .description(format!("Security group for Kubernetes ELB {name} ({key})"))
        .vpc_id(&world.vpc_id)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::SecurityGroup)
                .tags(
                    Tag::builder()
                        .key(format!("kubernetes.io/cluster/{CLUSTER}"))
                        .value("owned")
                        .build(),
                )
                .build(),
        )
        .send()
        .await?
        .group_id()
        .context("no group id")?
        .to_string();
    let range = IpRange::builder().cidr_ip("0.0.0.0/0").build();
    ec2.authorize_security_group_ingress()
        .group_id(&sg)
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(80)
                .to_port(80)
                .ip_ranges(range.clone())
                .build(),
        )
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("icmp")
                .from_port(3)
                .to_port(4)
                .ip_ranges(range)
                .build(),
        )
        .send()
        .await?;
    let elb = moto.elb();
    let out = elb
        .create_load_balancer()
        .load_balancer_name(&name)
        .listeners(
            ElbListener::builder()
                .protocol("TCP")
                .load_balancer_port(80)
                .instance_protocol("TCP")
                .instance_port(node_port(svc))
                .build()?,
        )
        .set_subnets(Some(world.subnets.iter().map(|(_, s)| s.clone()).collect()))
        .security_groups(&sg)
        .tags(
            ElbTag::builder()
                .key("kubernetes.io/service-name")
                .value(key)
                .build()?,
        )
        .tags(
            ElbTag::builder()
                .key(format!("kubernetes.io/cluster/{CLUSTER}"))
                .value("owned")
                .build()?,
        )
        .send()
        .await?;
    elb.modify_load_balancer_attributes()
        .load_balancer_name(&name)
        .load_balancer_attributes(
            LoadBalancerAttributes::builder()
                .access_log(AccessLog::builder().enabled(false).build())
                .connection_draining(ConnectionDraining::builder().enabled(false).build())
                .connection_settings(ConnectionSettings::builder().idle_timeout(60).build()?)
                .cross_zone_load_balancing(CrossZoneLoadBalancing::builder().enabled(false).build())
                .build(),
        )
        .send()
        .await?;
    elb.configure_health_check()
        .load_balancer_name(&name)
        .health_check(
            HealthCheck::builder()
                .target(format!("TCP:{}", node_port(svc)))
                .healthy_threshold(2)
                .unhealthy_threshold(6)
                .timeout(5)
                .interval(10)
                .build()?,
        )
        .send()
        .await?;
    ec2.authorize_security_group_ingress()
        .group_id(&world.security_group_id)
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("-1")
                .user_id_group_pairs(UserIdGroupPair::builder().group_id(&sg).build())
                .build(),
        )
        .send()
        .await?;
    let mut register = elb
        .register_instances_with_load_balancer()
        .load_balancer_name(&name);
    for i in &world.instances {
        register = register.instances(ElbInstance::builder().instance_id(&i.id).build());
    }
    register.send().await?;
    Ok((sg, out.dns_name().unwrap_or_default().to_string()))
}

/// The Go provider's NLB for `svc` (default security-group mode): NLB, target group with
/// upstream's name and default health check, targets, listener, attributes, and the node
/// group's client and path-MTU rules (no health rule: the client rule covers it).
async fn go_nlb(moto: &Moto, world: &World, svc: &Service) -> Result<(String, String, String, String)> {
    let name = default_load_balancer_name(svc);
    let key = "default/legacy-nlb";
    let v2 = moto.elbv2();
    let tags = [
        ("kubernetes.io/service-name", key.to_string()),
        ("kubernetes.io/cluster/e2e", "owned".to_string()),
    ];
    let v2tags = || {
        tags.iter()
            .map(|(k, v)| V2Tag::builder().key(*k).value(v).build())
            .collect::<Vec<_>>()
    };
    let lb = v2
        .create_load_balancer()
        .name(&name)
        .r#type(LoadBalancerTypeEnum::Network)
        .set_subnet_mappings(Some(
            world
                .subnets
                .iter()
                .map(|(_, s)| SubnetMapping::builder().subnet_id(s).build())
                .collect(),
        ))
        .set_tags(Some(v2tags()))
        .send()
        .await?;
    let lb = lb.load_balancers().first().context("no NLB")?.clone();
    let lb_arn = lb.load_balancer_arn().unwrap_or_default().to_string();
    let tg = v2
        .create_target_group()
        .name(go_target_group_name("default", "legacy-nlb", 80, node_port(svc)))
        .protocol(ProtocolEnum::Tcp)
        .port(node_port(svc))
        .vpc_id(&world.vpc_id)
        .target_type(TargetTypeEnum::Instance)
        .health_check_protocol(ProtocolEnum::Tcp)
        .health_check_port("traffic-port")
        .health_check_interval_seconds(30)
        .healthy_threshold_count(3)
        .unhealthy_threshold_count(3)
        .set_tags(Some(v2tags()))
        .send()
        .await?;
    let tg_arn = tg
        .target_groups()
        .first()
        .and_then(|t| t.target_group_arn())
        .context("no TG")?
        .to_string();
    let mut register = v2.register_targets().target_group_arn(&tg_arn);
    for i in &world.instances {
        register = register.targets(
            TargetDescription::builder()
                .id(&i.id)
                .port(node_port(svc))
                .build(),
        );
    }
    register.send().await?;
    let listener = v2
        .create_listener()
        .load_balancer_arn(&lb_arn)
        .port(80)
        .protocol(ProtocolEnum::Tcp)
        .default_actions(
            Action::builder()
                .r#type(ActionTypeEnum::Forward)
                .target_group_arn(&tg_arn)
                .build(),
        )
        .set_tags(Some(v2tags()))
        .send()
        .await?;
    let listener_arn = listener
        .listeners()
        .first()
        .and_then(|l| l.listener_arn())
        .context("no listener")?
        .to_string();
    v2.modify_load_balancer_attributes()
        .load_balancer_arn(&lb_arn)
        .attributes(
            LoadBalancerAttribute::builder()
                .key("load_balancing.cross_zone.enabled")
                .value("false")
                .build(),
        )
        .attributes(
            LoadBalancerAttribute::builder()
                .key("access_logs.s3.enabled")
                .value("false")
                .build(),
        )
        .send()
        .await?;
    let rule = |proto: &str, from: i32, to: i32, desc: &str| {
        IpPermission::builder()
            .ip_protocol(proto)
            .from_port(from)
            .to_port(to)
            .ip_ranges(IpRange::builder().cidr_ip("0.0.0.0/0").description(desc).build())
            .build()
    };
    moto.ec2()
        .authorize_security_group_ingress()
        .group_id(&world.security_group_id)
        .ip_permissions(rule(
            "tcp",
            node_port(svc),
            node_port(svc),
            &format!("kubernetes.io/rule/nlb/client={name}"),
        ))
        .ip_permissions(rule("icmp", 3, 4, "kubernetes.io/rule/nlb/mtu"))
        .send()
        .await?;
    Ok((
        lb_arn,
        tg_arn,
        listener_arn,
        lb.dns_name().unwrap_or_default().to_string(),
    ))
}

/// Starts the CCM on `world` with `extra_global` lines in `[Global]`.
fn start_ccm(cluster: &TestCluster, moto: &Moto, world: &World, extra_global: &str) -> Result<CcmProcess> {
    let config = cluster.dir().join("cloud.conf");
    std::fs::write(
        &config,
        moto.cloud_config(world)
            .replacen("[Global]\n", &format!("[Global]\n{extra_global}"), 1),
    )?;
    CcmProcess::start_with_env(
        "cloud-controller-manager-aws",
        "ccm-aws-adoption",
        &cluster.ccm_kubeconfig("aws/base")?,
        cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--leader-elect=false".into(),
            format!("--cluster-name={CLUSTER}"),
        ],
        &moto.sdk_env(),
    )
}

/// Initialised, Ready Nodes for the world's instances, as a running cluster has them.
async fn ready_nodes(nodes: &Api<Node>, world: &World) -> Result<()> {
    for i in &world.instances {
        let node = Node {
            metadata: ObjectMeta {
                name: Some(i.private_dns_name.clone()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(format!("aws:///{}/{}", i.zone, i.id)),
                ..Default::default()
            }),
            status: None,
        };
        nodes.create(&PostParams::default(), &node).await?;
        set_ready(nodes, &i.private_dns_name, "True").await?;
    }
    Ok(())
}

/// `NLBSecurityGroupMode = Managed` on a cluster whose NLB was made without security groups
/// (before the mode existed): AWS cannot add groups to such an NLB, so it is left alone — no
/// group is made, none is set — as upstream does.
#[tokio::test]
async fn managed_security_group_mode_leaves_an_nlb_without_groups_alone() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let moto = Moto::start().await?;
    let world = moto.build_world(CLUSTER, 2).await?;
    let client = cluster.client().await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    ready_nodes(&Api::all(client), &world).await?;
    let nlb_svc = services
        .create(
            &PostParams::default(),
            &load_balancer_service("legacy-nlb", &[("type", "nlb")], &[(80, "http")]),
        )
        .await?;
    let (lb_arn, _, _, nlb_dns) = go_nlb(&moto, &world, &nlb_svc).await?;
    let before = moto.actions().len();
    let ccm = start_ccm(&cluster, &moto, &world, "NLBSecurityGroupMode = Managed\n")?;
    let nlb = wait_for_ingress(&services, "legacy-nlb", T).await?;
    assert_eq!(ingress_hostname(&nlb).as_deref(), Some(nlb_dns.as_str()));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let actions = moto.actions()[before..].to_vec();
    assert_eq!(
        mutating(&actions),
        Vec::<String>::new(),
        "{actions:?}\n{}",
        ccm.log()
    );
    let lb = moto
        .elbv2()
        .describe_load_balancers()
        .load_balancer_arns(&lb_arn)
        .send()
        .await?;
    assert!(lb.load_balancers()[0].security_groups().is_empty());
    Ok(())
}

#[tokio::test]
async fn load_balancers_made_by_the_go_provider_are_adopted_without_one_mutating_call() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let moto = Moto::start().await?;
    let world = moto.build_world(CLUSTER, 2).await?;
    let client = cluster.client().await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let nodes: Api<Node> = Api::all(client);

    // The cluster as the Go provider left it: initialised, Ready Nodes and two Services.
    ready_nodes(&nodes, &world).await?;
    let clb_svc = services
        .create(
            &PostParams::default(),
            &load_balancer_service("legacy-clb", &[], &[(80, "http")]),
        )
        .await?;
    let nlb_svc = services
        .create(
            &PostParams::default(),
            &load_balancer_service("legacy-nlb", &[("type", "nlb")], &[(80, "http")]),
        )
        .await?;
    let (clb_group, clb_dns) = go_classic(&moto, &world, &clb_svc).await?;
    let (lb_arn, tg_arn, listener_arn, nlb_dns) = go_nlb(&moto, &world, &nlb_svc).await?;

    let before = moto.actions().len();
    let ccm = start_ccm(&cluster, &moto, &world, "")?;
    let clb = wait_for_ingress(&services, "legacy-clb", T).await?;
    let nlb = wait_for_ingress(&services, "legacy-nlb", T).await?;
    assert_eq!(ingress_hostname(&clb).as_deref(), Some(clb_dns.as_str()));
    assert_eq!(ingress_hostname(&nlb).as_deref(), Some(nlb_dns.as_str()));
    // Let any trailing work of the two syncs reach moto.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let actions = moto.actions()[before..].to_vec();
    assert!(!actions.is_empty(), "the CCM asked moto nothing?");
    assert_eq!(
        mutating(&actions),
        Vec::<String>::new(),
        "adoption must not change anything; the CCM's calls were {actions:?}\n{}",
        ccm.log()
    );

    // Upstream's default set of controllers includes the route controller; without
    // --cluster-cidr it is not started (upstream would fail to start) and a warning says so.
    assert!(
        ccm.log()
            .contains("the node-route-controller is not started: --cluster-cidr is not set"),
        "{}",
        ccm.log()
    );
    assert!(!ccm.runs_controller("route").await);

    // Same resources, same identities.
    let v2 = moto.elbv2();
    let lbs = v2.describe_load_balancers().send().await?;
    assert_eq!(
        lbs.load_balancers()
            .iter()
            .filter_map(|l| l.load_balancer_arn())
            .collect::<Vec<_>>(),
        [lb_arn.as_str()]
    );
    let listeners = v2.describe_listeners().load_balancer_arn(&lb_arn).send().await?;
    assert_eq!(
        listeners
            .listeners()
            .iter()
            .filter_map(|l| l.listener_arn())
            .collect::<Vec<_>>(),
        [listener_arn.as_str()]
    );
    let tgs = v2.describe_target_groups().send().await?;
    assert_eq!(
        tgs.target_groups()
            .iter()
            .filter_map(|t| t.target_group_arn())
            .collect::<Vec<_>>(),
        [tg_arn.as_str()]
    );
    let elbs = moto.elb().describe_load_balancers().send().await?;
    let elb = &elbs.load_balancer_descriptions()[0];
    assert_eq!(elb.security_groups(), [clb_group.as_str()]);
    Ok(())
}
