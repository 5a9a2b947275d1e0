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
use k8s_openapi::api::core::v1::{Event, Node, NodeSpec, Service};
use kube::{
    Api,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};
use rcp_e2e::{
    Moto, TestCluster,
    ccm::CcmProcess,
    k8s::{ingress_hostname, load_balancer_service, set_ready, wait_for_ingress},
    moto::{World, mutating},
};
use sha1::Digest as _;

const T: Duration = Duration::from_secs(90);
const CLUSTER: &str = "e2e";

/// A release of the Go AWS provider, for what it named and made differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GoRelease {
    /// 1.18: target-group names without the NodePort and the health-check fields; health rules
    /// always made.
    V1_18,
    /// 1.19: names with the NodePort, without the health-check fields; health rules always.
    V1_19,
    /// 1.20: names with both; health rules always.
    V1_20,
    /// Newest: names as 1.20; no health rule where the client rule covers it.
    Newest,
}

/// What upstream's `buildTargetGroupName` of `release` names the target group of `svc`'s first
/// port: SHA-1 over the fields written one after another (written out here from the Go code of
/// each release, independently of the provider's own code).
fn go_target_group_name(release: GoRelease, svc: &Service) -> String {
    let shape = GoNlbShape::of(svc);
    let (ns, name) = (
        svc.metadata.namespace.as_deref().unwrap_or("default"),
        svc.metadata.name.as_deref().unwrap_or_default(),
    );
    let port = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map(|p| p[0].port)
        .unwrap_or_default()
        .to_string();
    let node_port = node_port(svc).to_string();
    let mut parts = vec![CLUSTER, ns, name, port.as_str()];
    if release != GoRelease::V1_18 {
        parts.push(&node_port);
    }
    parts.extend([shape.protocol.as_str(), "instance"]);
    if matches!(release, GoRelease::V1_20 | GoRelease::Newest) {
        parts.extend([shape.health_protocol(), "30"]);
    }
    let mut h = sha1::Sha1::new();
    for part in parts {
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

/// What the Go provider made an NLB of from a Service: the traffic protocol of its first port,
/// the health-check NodePort of an `externalTrafficPolicy: Local` Service, and the client
/// CIDRs (`loadBalancerSourceRanges`, or everyone).
struct GoNlbShape {
    protocol: String,
    health_check_node_port: Option<i32>,
    client_cidrs: Vec<String>,
}

impl GoNlbShape {
    fn of(svc: &Service) -> Self {
        let spec = svc.spec.clone().unwrap_or_default();
        let local = spec.external_traffic_policy.as_deref() == Some("Local");
        let ranges = spec.load_balancer_source_ranges.unwrap_or_default();
        Self {
            protocol: spec
                .ports
                .as_ref()
                .and_then(|p| p[0].protocol.clone())
                .unwrap_or_else(|| "TCP".into()),
            health_check_node_port: spec.health_check_node_port.filter(|_| local),
            client_cidrs: if ranges.is_empty() {
                vec!["0.0.0.0/0".into()]
            } else {
                ranges
            },
        }
    }

    /// HTTP on `/healthz` of the health-check NodePort for Local, TCP on the traffic port
    /// otherwise (every release).
    fn health_protocol(&self) -> &'static str {
        if self.health_check_node_port.is_some() {
            "HTTP"
        } else {
            "TCP"
        }
    }
}

fn node_port(s: &Service) -> i32 {
    s.spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|p| p[0].node_port)
        .unwrap_or_default()
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

/// The Go provider's NLB for `svc` (default security-group mode), as the newest release makes
/// it: NLB, target group with upstream's name and default health check, targets, listener,
/// attributes, and the node group's client and path-MTU rules (no health rule: the client rule
/// covers it).
async fn go_nlb(moto: &Moto, world: &World, svc: &Service) -> Result<(String, String, String, String)> {
    go_nlb_of(moto, world, svc, GoRelease::Newest).await
}

/// [`go_nlb`] as `release` made it: its target-group name and, but for the newest, a health
/// rule from each of the NLB's subnets on the NodePort beside the client rule.
async fn go_nlb_of(
    moto: &Moto,
    world: &World,
    svc: &Service,
    release: GoRelease,
) -> Result<(String, String, String, String)> {
    let name = default_load_balancer_name(svc);
    let (ns, svc_name) = (
        svc.metadata.namespace.as_deref().unwrap_or("default"),
        svc.metadata.name.as_deref().unwrap_or_default(),
    );
    let key = format!("{ns}/{svc_name}");
    let shape = GoNlbShape::of(svc);
    let v2 = moto.elbv2();
    let tags = [
        ("kubernetes.io/service-name", key.clone()),
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
        .name(go_target_group_name(release, svc))
        .protocol(ProtocolEnum::from(shape.protocol.as_str()))
        .port(node_port(svc))
        .vpc_id(&world.vpc_id)
        .target_type(TargetTypeEnum::Instance)
        .health_check_protocol(ProtocolEnum::from(shape.health_protocol()))
        .health_check_port(
            shape
                .health_check_node_port
                .map_or("traffic-port".to_string(), |p| p.to_string()),
        )
        .set_health_check_path(shape.health_check_node_port.map(|_| "/healthz".to_string()))
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
        .port(
            svc.spec
                .as_ref()
                .and_then(|s| s.ports.as_ref())
                .map(|p| p[0].port)
                .unwrap_or_default(),
        )
        .protocol(ProtocolEnum::from(shape.protocol.as_str()))
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
    let rule = |proto: &str, from: i32, to: i32, cidr: &str, desc: &str| {
        IpPermission::builder()
            .ip_protocol(proto)
            .from_port(from)
            .to_port(to)
            .ip_ranges(IpRange::builder().cidr_ip(cidr).description(desc).build())
            .build()
    };
    let np = node_port(svc);
    let health_port = shape.health_check_node_port.unwrap_or(np);
    let client_protocol = shape.protocol.to_ascii_lowercase();
    let mut grant = moto
        .ec2()
        .authorize_security_group_ingress()
        .group_id(&world.security_group_id);
    for cidr in &shape.client_cidrs {
        grant = grant.ip_permissions(rule(
            &client_protocol,
            np,
            np,
            cidr,
            &format!("kubernetes.io/rule/nlb/client={name}"),
        ));
    }
    // Up to 1.20 the health rules were always made; the newest release makes them only where
    // the client rule does not cover them.
    let covered = shape.client_cidrs == ["0.0.0.0/0"] && client_protocol == "tcp" && health_port == np;
    if release != GoRelease::Newest || !covered {
        let subnets = moto
            .ec2()
            .describe_subnets()
            .set_subnet_ids(Some(world.subnets.iter().map(|(_, s)| s.clone()).collect()))
            .send()
            .await?;
        for s in subnets.subnets() {
            grant = grant.ip_permissions(rule(
                "tcp",
                health_port,
                health_port,
                s.cidr_block().unwrap_or_default(),
                &format!("kubernetes.io/rule/nlb/health={name}"),
            ));
        }
    }
    grant.send().await?;
    // One path-MTU rule per client CIDR, shared by every NLB of the group.
    let mtu_cidrs: Vec<String> = moto
        .ec2()
        .describe_security_groups()
        .group_ids(&world.security_group_id)
        .send()
        .await?
        .security_groups()
        .iter()
        .flat_map(|g| g.ip_permissions())
        .flat_map(|p| p.ip_ranges())
        .filter(|r| r.description() == Some("kubernetes.io/rule/nlb/mtu"))
        .filter_map(|r| r.cidr_ip().map(str::to_string))
        .collect();
    for cidr in &shape.client_cidrs {
        if !mtu_cidrs.contains(cidr) {
            moto.ec2()
                .authorize_security_group_ingress()
                .group_id(&world.security_group_id)
                .ip_permissions(rule("icmp", 3, 4, cidr, "kubernetes.io/rule/nlb/mtu"))
                .send()
                .await?;
        }
    }
    Ok((
        lb_arn,
        tg_arn,
        listener_arn,
        lb.dns_name().unwrap_or_default().to_string(),
    ))
}

/// The node group's rules, as `protocol from-to cidr description` (rules naming groups as
/// `protocol from-to group <id>`), sorted.
async fn node_rules(moto: &Moto, world: &World) -> Result<Vec<String>> {
    let out = moto
        .ec2()
        .describe_security_groups()
        .group_ids(&world.security_group_id)
        .send()
        .await?;
    let mut rules: Vec<String> = out
        .security_groups()
        .iter()
        .flat_map(|g| g.ip_permissions())
        .flat_map(|p| {
            let head = format!(
                "{} {}-{}",
                p.ip_protocol().unwrap_or_default(),
                p.from_port().unwrap_or_default(),
                p.to_port().unwrap_or_default()
            );
            p.ip_ranges()
                .iter()
                .map(|r| {
                    format!(
                        "{head} {} {}",
                        r.cidr_ip().unwrap_or_default(),
                        r.description().unwrap_or_default()
                    )
                })
                .chain(
                    p.user_id_group_pairs()
                        .iter()
                        .map(|u| format!("{head} group {}", u.group_id().unwrap_or_default())),
                )
                .collect::<Vec<_>>()
        })
        .collect();
    rules.sort();
    Ok(rules)
}

/// Every target group: ARN, name, port and health check (protocol, port, path, interval,
/// thresholds), sorted.
async fn target_groups(moto: &Moto) -> Result<Vec<String>> {
    let mut groups: Vec<String> = moto
        .elbv2()
        .describe_target_groups()
        .send()
        .await?
        .target_groups()
        .iter()
        .map(|t| {
            format!(
                "{} {} {:?} {:?} {:?} {:?} {:?} {:?}/{:?}",
                t.target_group_arn().unwrap_or_default(),
                t.target_group_name().unwrap_or_default(),
                t.port(),
                t.health_check_protocol(),
                t.health_check_port(),
                t.health_check_path(),
                t.health_check_interval_seconds(),
                t.healthy_threshold_count(),
                t.unhealthy_threshold_count()
            )
        })
        .collect();
    groups.sort();
    Ok(groups)
}

/// The `EnsuredLoadBalancer` events about `default/<name>`, counting repeats.
async fn ensured_count(client: &kube::Client, name: &str) -> Result<i32> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    Ok(events
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(name)
                && e.reason.as_deref() == Some("EnsuredLoadBalancer")
        })
        .map(|e| e.count.unwrap_or(1))
        .sum())
}

/// Starts the CCM on `world` with `extra_global` lines in `[Global]`.
/// Waits until the CCM's service-lb controller has finished `n` reconciles successfully: proof
/// that the syncs being checked were made (not just that nothing happened yet).
async fn reconciled(ccm: &CcmProcess, n: f64) -> Result<()> {
    ccm.wait_service_reconciles(n, T).await
}

fn start_ccm(cluster: &TestCluster, moto: &Moto, world: &World, extra_global: &str) -> Result<CcmProcess> {
    start_ccm_named(cluster, moto, world, extra_global, "ccm-aws-adoption")
}

fn start_ccm_named(
    cluster: &TestCluster,
    moto: &Moto,
    world: &World,
    extra_global: &str,
    name: &str,
) -> Result<CcmProcess> {
    let config = cluster.dir().join("cloud.conf");
    std::fs::write(
        &config,
        moto.cloud_config(world)
            .replacen("[Global]\n", &format!("[Global]\n{extra_global}"), 1),
    )?;
    CcmProcess::start_with_env(
        "cloud-controller-manager-aws",
        name,
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
    reconciled(&ccm, 1.0).await?;
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
    // Both syncs done (counted by the controller), then read what reached moto.
    reconciled(&ccm, 2.0).await?;
    let actions = moto.actions()[before..].to_vec();
    assert!(!actions.is_empty(), "the CCM asked moto nothing?");
    assert_eq!(
        mutating(&actions),
        Vec::<String>::new(),
        "adoption must not change anything; the CCM's calls were {actions:?}\n{}",
        ccm.log()
    );
    // A second sync of both, by a restarted CCM: still not one mutating call.
    drop(ccm);
    let before_restart = moto.actions().len();
    let again = start_ccm_named(&cluster, &moto, &world, "", "ccm-aws-adoption-again")?;
    reconciled(&again, 2.0).await?;
    let actions = moto.actions()[before_restart..].to_vec();
    assert!(!actions.is_empty(), "the restarted CCM asked moto nothing?");
    assert_eq!(
        mutating(&actions),
        Vec::<String>::new(),
        "a second sync must not change anything either: {actions:?}\n{}",
        again.log()
    );
    let ccm = again;

    // Upstream's default set of controllers includes the route controller; without
    // --cluster-cidr it is not started (upstream would fail to start) and a warning says so.
    assert!(
        ccm.log()
            .contains("the node-route-controller is not started: --cluster-cidr is not set"),
        "{}",
        ccm.log()
    );
    assert!(!ccm.runs_controller("route").await?);

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

/// NLBs made by the Go provider of 1.18, 1.19 and 1.20 (target groups named as each release
/// named them; health rules from the NLB's subnets beside the client rule, as each of them
/// made them) are adopted as upstream's newest release adopts them: target groups found by
/// NodePort, existing health rules left alone — not one mutating call, in the first sync and
/// in a second one (a changed annotation makes the service controller sync every Service
/// again).
#[tokio::test]
async fn nlbs_made_by_go_1_18_1_19_and_1_20_are_adopted_without_one_mutating_call() -> Result<()> {
    let services = [
        ("nlb-go118", GoRelease::V1_18),
        ("nlb-go119", GoRelease::V1_19),
        ("nlb-go120", GoRelease::V1_20),
    ]
    .map(|(name, release)| {
        (
            load_balancer_service(name, &[("type", "nlb")], &[(80, "http")]),
            release,
        )
    });
    adopted_without_one_mutating_call(&services).await
}

/// The Services whose NLB needs more than the client rule, made by Go 1.18–1.20:
/// `externalTrafficPolicy: Local` (a target group checking `/healthz` on the health-check
/// NodePort every 30 s with thresholds 3/3, where the newest release would make 10 s and 2/2;
/// health rules on that port), `loadBalancerSourceRanges` (client rules from those ranges only,
/// health rules from the subnets, a path-MTU rule per range) and UDP (a UDP target group and
/// client rule, TCP health rules). Adopted as they are: the target group is kept (AWS cannot
/// change an interval in place, and a new group would take every target out until its first
/// health checks pass), its thresholds are not touched, no rule is revoked or granted — not
/// one mutating call over two syncs.
#[tokio::test]
async fn nlbs_of_local_udp_and_source_range_services_made_by_go_1_18_to_1_20_are_adopted_without_one_mutating_call()
-> Result<()> {
    let local = |name: &str| {
        let mut svc = load_balancer_service(name, &[("type", "nlb")], &[(80, "http")]);
        if let Some(spec) = svc.spec.as_mut() {
            spec.external_traffic_policy = Some("Local".into());
        }
        svc
    };
    let ranges = |name: &str| {
        let mut svc = load_balancer_service(name, &[("type", "nlb")], &[(443, "https")]);
        if let Some(spec) = svc.spec.as_mut() {
            spec.load_balancer_source_ranges = Some(vec!["203.0.113.0/24".into(), "198.51.100.0/26".into()]);
        }
        svc
    };
    let udp = |name: &str| {
        let mut svc = load_balancer_service(name, &[("type", "nlb")], &[(53, "dns")]);
        if let Some(port) = svc
            .spec
            .as_mut()
            .and_then(|s| s.ports.as_mut())
            .and_then(|p| p.first_mut())
        {
            port.protocol = Some("UDP".into());
        }
        svc
    };
    let services = [
        (local("local-go118"), GoRelease::V1_18),
        (local("local-go119"), GoRelease::V1_19),
        (local("local-go120"), GoRelease::V1_20),
        (ranges("ranges-go118"), GoRelease::V1_18),
        (ranges("ranges-go120"), GoRelease::V1_20),
        (udp("udp-go120"), GoRelease::V1_20),
    ];
    adopted_without_one_mutating_call(&services).await
}

/// Creates `services`, makes each one's NLB as its Go release made it, starts the CCM and
/// checks that two syncs of each adopt them with no mutating call: the same ingress, rules and
/// target groups.
async fn adopted_without_one_mutating_call(services: &[(Service, GoRelease)]) -> Result<()> {
    let cluster = TestCluster::start().await?;
    let moto = Moto::start().await?;
    let world = moto.build_world(CLUSTER, 2).await?;
    let client = cluster.client().await?;
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    ready_nodes(&Api::all(client.clone()), &world).await?;
    let mut made = Vec::new();
    for (svc, release) in services {
        let svc = api.create(&PostParams::default(), svc).await?;
        let name = svc.metadata.name.clone().unwrap_or_default();
        if svc
            .spec
            .as_ref()
            .and_then(|s| s.external_traffic_policy.as_deref())
            == Some("Local")
        {
            assert!(
                GoNlbShape::of(&svc).health_check_node_port.is_some(),
                "the API server allocates a health-check NodePort to {name}"
            );
        }
        made.push((name, go_nlb_of(&moto, &world, &svc, *release).await?));
    }
    let rules_before = node_rules(&moto, &world).await?;
    assert!(
        rules_before
            .iter()
            .filter(|r| r.contains("kubernetes.io/rule/nlb/health="))
            .count()
            >= services.len() * world.subnets.len(),
        "{rules_before:#?}"
    );
    let tgs_before = target_groups(&moto).await?;

    let before = moto.actions().len();
    let ccm = start_ccm(&cluster, &moto, &world, "")?;
    for (name, (_, _, _, dns)) in &made {
        let svc = wait_for_ingress(&api, name, T).await?;
        assert_eq!(ingress_hostname(&svc).as_deref(), Some(dns.as_str()));
    }
    // A second sync of each: the annotation change is a reason to sync (upstream's
    // needsUpdate); each Service's EnsuredLoadBalancer count shows it was done.
    for (name, _) in &made {
        rcp_e2e::k8s::wait_for(&format!("the first sync of {name}"), T, || async {
            (ensured_count(&client, name).await.ok()? >= 1).then_some(())
        })
        .await?;
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"annotations": {"e2e/second-sync": "1"}}})),
        )
        .await?;
    }
    for (name, _) in &made {
        rcp_e2e::k8s::wait_for(&format!("the second sync of {name}"), T, || async {
            (ensured_count(&client, name).await.ok()? >= 2).then_some(())
        })
        .await?;
    }
    let actions = moto.actions()[before..].to_vec();
    assert_eq!(
        mutating(&actions),
        Vec::<String>::new(),
        "adoption must not change anything; the CCM's calls were {actions:?}\n{}",
        ccm.log()
    );
    assert_eq!(node_rules(&moto, &world).await?, rules_before);
    assert_eq!(target_groups(&moto).await?, tgs_before);
    Ok(())
}
