//! The newest upstream AWS cloud-controller-manager (`k8s.io/cloud-provider-aws`, built from its
//! Go module by `hack/install-test-deps.sh`) and ours, side by side on one moto world and one
//! API server: upstream initialises two Nodes and makes a Classic ELB and an NLB, then stops;
//! ours takes its objects over with not one mutating call over two proven syncs (a start and a
//! restart), then initialises two more Nodes (same zones) and makes the same two load balancers
//! for Services of its own. What each made is described from moto and the API server,
//! normalised (IDs, names, ports and addresses replaced by what they stand for) and compared
//! field by field. Every difference must be one `docs/migration.md` lists with why
//! ([`DOCUMENTED_DIFFERENCES`]); the table is printed either way.

use std::{collections::BTreeMap, time::Duration};

use anyhow::{Context, Result};
use k8s_cloud_provider::service::helpers::default_load_balancer_name;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use nix::sys::signal::Signal;
use rcp_e2e::{
    Moto, TestCluster,
    ccm::{CcmProcess, run_to_exit_with_env},
    fault_proxy::{Action, FaultProxy, Rule},
    k8s::{load_balancer_service, set_ready, tainted_node, wait_for, wait_for_ingress},
    moto::{Instance, World, mutating},
    paths,
};

const T: Duration = Duration::from_secs(120);
const CLUSTER: &str = "side-by-side";

/// Differences between upstream's and our output that `docs/migration.md` explains, as
/// `(field, why)`; a difference not listed here fails the test.
const DOCUMENTED_DIFFERENCES: &[(&str, &str)] = &[
    (
        "classic: clb.attributes",
        "ours leaves the connection-draining timeout unset while draining is off (AWS keeps its default 300 s; moto reports none)",
    ),
    (
        "classic: clb.group0.tags",
        "ours also tags the ELB's security group kubernetes.io/service-name=<namespace>/<name>, so orphans can name the Service it belonged to",
    ),
    (
        "nlb: nlb.scheme",
        "upstream leaves Scheme to AWS's default (internet-facing; moto then reports none), ours sends internet-facing",
    ),
];

/// The Classic ELB answer with the health check real AWS reports for every load balancer
/// (`TCP:<first instance port>`, 30 s, 5 s, 2/10 thresholds until it is configured), which
/// moto leaves out: upstream's `ensureLoadBalancerHealthCheck` dereferences it without a check
/// and the process dies (v1.37.1, `aws_loadbalancer.go:1609`).
fn with_default_health_check(body: &str) -> String {
    let Some(start) = body.find("<LoadBalancerDescriptions>") else {
        return body.to_string();
    };
    let mut out = String::with_capacity(body.len() + 256);
    out.push_str(&body[..start]);
    let mut rest = &body[start..];
    let mut depth = 0usize;
    let mut member_start = 0usize;
    while !rest.is_empty() {
        let open = rest.find("<member>");
        let close = rest.find("</member>");
        let end = rest.find("</LoadBalancerDescriptions>");
        match (open, close) {
            (Some(o), Some(c)) if o < c && end.is_none_or(|e| o < e) => {
                out.push_str(&rest[..o + "<member>".len()]);
                if depth == 0 {
                    member_start = out.len();
                }
                depth += 1;
                rest = &rest[o + "<member>".len()..];
            }
            (_, Some(c)) if end.is_none_or(|e| c < e) => {
                out.push_str(&rest[..c]);
                depth = depth.saturating_sub(1);
                if depth == 0 && !out[member_start..].contains("<HealthCheck>") {
                    let port = out[member_start..]
                        .split("<InstancePort>")
                        .nth(1)
                        .and_then(|p| p.split('<').next())
                        .unwrap_or("80")
                        .to_string();
                    out.push_str(&format!(
                        "<HealthCheck><Target>TCP:{port}</Target><Interval>30</Interval><Timeout>5</Timeout>\
                         <UnhealthyThreshold>2</UnhealthyThreshold><HealthyThreshold>10</HealthyThreshold></HealthCheck>"
                    ));
                }
                out.push_str("</member>");
                rest = &rest[c + "</member>".len()..];
            }
            _ => {
                out.push_str(rest);
                break;
            }
        }
    }
    out
}

#[test]
fn the_default_health_check_goes_into_each_load_balancer_without_one() {
    let body = "<R><LoadBalancerDescriptions><member><ListenerDescriptions><member><Listener><InstancePort>31000</InstancePort></Listener></member></ListenerDescriptions></member>\
                <member><HealthCheck><Target>HTTP:1/x</Target></HealthCheck></member></LoadBalancerDescriptions></R>";
    let out = with_default_health_check(body);
    assert_eq!(out.matches("<HealthCheck>").count(), 2, "{out}");
    assert!(out.contains("<Target>TCP:31000</Target>"), "{out}");
    assert!(out.contains("<Target>HTTP:1/x</Target>"), "{out}");
    assert!(out.ends_with("</member></LoadBalancerDescriptions></R>"), "{out}");
}

/// The upstream binary, with moto as EC2/ELB/ELBv2 (`[ServiceOverride]`), the cloud-node,
/// cloud-node-lifecycle and service controllers (routes off), no leader election.
fn start_upstream(cluster: &TestCluster, moto: &Moto, aws: &str, world: &World) -> Result<CcmProcess> {
    let config = cluster.dir().join("upstream-cloud.conf");
    std::fs::write(&config, moto.cloud_config(world).replace(moto.endpoint(), aws))?;
    let mut env = moto.sdk_env();
    env.push(("AWS_REGION", "us-east-1"));
    CcmProcess::start_binary(
        &paths::test_bin("aws-cloud-controller-manager")?,
        "aws-cloud-controller-manager-upstream",
        cluster.kubeconfig_path(),
        cluster.dir(),
        &[
            "--cloud-provider=aws".into(),
            format!("--cloud-config={}", config.display()),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=false".into(),
            "--controllers=cloud-node,cloud-node-lifecycle,service".into(),
            "--configure-cloud-routes=false".into(),
            format!("--cluster-name={CLUSTER}"),
            "--v=2".into(),
        ],
        &env,
    )
}

/// Ours, as `deploy/aws/base` runs it (its ServiceAccount and RBAC).
fn start_ours(
    cluster: &TestCluster,
    moto: &Moto,
    aws: &str,
    world: &World,
    name: &str,
) -> Result<CcmProcess> {
    let config = cluster.dir().join("cloud.conf");
    std::fs::write(&config, moto.cloud_config(world).replace(moto.endpoint(), aws))?;
    CcmProcess::start_with_env(
        "cloud-controller-manager-aws",
        name,
        &cluster.ccm_kubeconfig("aws/base")?,
        cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--leader-elect=false".into(),
            "--controllers=cloud-node,cloud-node-lifecycle,service".into(),
            format!("--cluster-name={CLUSTER}"),
        ],
        &moto.sdk_env(),
    )
}

/// Replaces every `(from, to)` in `text`, longest `from` first.
fn normalise(text: &str, replacements: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = replacements.iter().filter(|(f, _)| !f.is_empty()).collect();
    sorted.sort_by_key(|(f, _)| std::cmp::Reverse(f.len()));
    let mut out = text.to_string();
    for (from, to) in sorted {
        out = out.replace(from.as_str(), to);
    }
    out
}

/// What stands for an instance in the descriptions.
fn instance_replacements(i: &Instance) -> Vec<(String, String)> {
    let mut r = vec![
        (i.id.clone(), "<instance-id>".into()),
        (i.private_dns_name.clone(), "<private-dns>".into()),
        (i.private_ip.clone(), "<private-ip>".into()),
    ];
    if let Some(ip) = &i.public_ip {
        r.push((ip.clone(), "<public-ip>".into()));
    }
    if let Some(dns) = &i.public_dns_name {
        r.push((dns.clone(), "<public-dns>".into()));
    }
    r
}

/// The Node as the CCM left it: labels, provider ID, addresses (in order), taints.
fn describe_node(node: &Node, instance: &Instance) -> BTreeMap<String, String> {
    let r = instance_replacements(instance);
    let mut d = BTreeMap::new();
    for (k, v) in node.metadata.labels.clone().unwrap_or_default() {
        if k == "kubernetes.io/hostname" {
            continue; // the test wrote it
        }
        d.insert(format!("node.label {k}"), normalise(&v, &r));
    }
    let spec = node.spec.clone().unwrap_or_default();
    d.insert(
        "node.providerID".into(),
        normalise(&spec.provider_id.unwrap_or_default(), &r),
    );
    let mut taints: Vec<String> = spec
        .taints
        .unwrap_or_default()
        .into_iter()
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect();
    taints.sort();
    d.insert("node.taints".into(), taints.join(","));
    let addresses: Vec<String> = k8s_cloud_provider::node::helpers::addresses(node)
        .iter()
        .map(|a| format!("{}={}", a.type_, normalise(&a.address, &r)))
        .collect();
    d.insert("node.addresses".into(), addresses.join(","));
    d
}

/// One Service's load balancer as moto describes it, IDs and names replaced.
async fn describe_load_balancer(
    moto: &Moto,
    world: &World,
    svc: &Service,
) -> Result<BTreeMap<String, String>> {
    let name = default_load_balancer_name(svc);
    let svc_name = svc.metadata.name.clone().unwrap_or_default();
    let uid = svc.metadata.uid.clone().unwrap_or_default();
    let node_ports: Vec<String> = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .iter()
        .filter_map(|p| p.node_port.map(|n| n.to_string()))
        .collect();
    let mut r: Vec<(String, String)> = vec![
        (name.clone(), "<lb-name>".into()),
        (format!("default/{svc_name}"), "default/<service>".into()),
        (uid.clone(), "<service-uid>".into()),
        (world.vpc_id.clone(), "<vpc>".into()),
        (world.security_group_id.clone(), "<node-group>".into()),
    ];
    for (i, (_, subnet)) in world.subnets.iter().enumerate() {
        r.push((subnet.clone(), format!("<subnet-{i}>")));
    }
    for n in &node_ports {
        r.push((n.clone(), "<node-port>".into()));
    }
    for i in &world.instances {
        r.push((i.id.clone(), "<instance>".into()));
    }
    let ec2 = moto.ec2();
    let mut d = BTreeMap::new();
    let nlb = svc.metadata.annotations.as_ref().is_some_and(|a| {
        a.get("service.beta.kubernetes.io/aws-load-balancer-type")
            .is_some()
    });
    let mut groups: Vec<String> = Vec::new();
    if nlb {
        let v2 = moto.elbv2();
        let lbs = v2.describe_load_balancers().names(&name).send().await?;
        let lb = lbs.load_balancers().first().context("no NLB")?.clone();
        let arn = lb.load_balancer_arn().unwrap_or_default().to_string();
        r.push((arn.clone(), "<lb-arn>".into()));
        r.push((lb.dns_name().unwrap_or_default().to_string(), "<lb-dns>".into()));
        groups.extend(lb.security_groups().iter().cloned());
        d.insert("nlb.type".into(), format!("{:?}", lb.r#type()));
        d.insert("nlb.scheme".into(), format!("{:?}", lb.scheme()));
        d.insert("nlb.subnets".into(), lb.availability_zones().len().to_string());
        d.insert(
            "nlb.security-groups".into(),
            lb.security_groups().len().to_string(),
        );
        let attrs = v2
            .describe_load_balancer_attributes()
            .load_balancer_arn(&arn)
            .send()
            .await?;
        let a = key_values(
            attrs
                .attributes()
                .iter()
                .map(|x| (x.key().unwrap_or_default(), x.value().unwrap_or_default())),
        );
        d.insert("nlb.attributes".into(), a);
        let tags = v2.describe_tags().resource_arns(&arn).send().await?;
        let t = key_values(tags.tag_descriptions().iter().flat_map(|td| {
            td.tags()
                .iter()
                .map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default()))
        }));
        d.insert("nlb.tags".into(), normalise(&t, &r));
        let tgs = v2.describe_target_groups().load_balancer_arn(&arn).send().await?;
        for (i, tg) in tgs.target_groups().iter().enumerate() {
            let tg_name = tg.target_group_name().unwrap_or_default().to_string();
            r.push((
                tg.target_group_arn().unwrap_or_default().to_string(),
                format!("<tg-arn-{i}>"),
            ));
            // k8s-<namespace>-<name>-<hash>: the shape, the hash replaced.
            let shape = tg_name
                .rsplit_once('-')
                .map(|(p, _)| format!("{p}-<hash>"))
                .unwrap_or_default();
            let short: String = svc_name
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .take(8)
                .collect();
            d.insert(
                format!("nlb.tg{i}.name"),
                normalise(&shape, &[(short, "<service>".into())]),
            );
            d.insert(
                format!("nlb.tg{i}"),
                normalise(
                    &format!(
                        "protocol={:?} port={:?} target-type={:?} health={:?}:{:?} path={:?} interval={:?} timeout={:?} healthy={:?} unhealthy={:?} matcher={:?}",
                        tg.protocol(),
                        tg.port(),
                        tg.target_type(),
                        tg.health_check_protocol(),
                        tg.health_check_port(),
                        tg.health_check_path(),
                        tg.health_check_interval_seconds(),
                        tg.health_check_timeout_seconds(),
                        tg.healthy_threshold_count(),
                        tg.unhealthy_threshold_count(),
                        tg.matcher().and_then(|m| m.http_code()),
                    ),
                    &r,
                ),
            );
            let attrs = v2
                .describe_target_group_attributes()
                .target_group_arn(tg.target_group_arn().unwrap_or_default())
                .send()
                .await?;
            let a = key_values(
                attrs
                    .attributes()
                    .iter()
                    .map(|x| (x.key().unwrap_or_default(), x.value().unwrap_or_default())),
            );
            d.insert(format!("nlb.tg{i}.attributes"), a);
            let health = v2
                .describe_target_health()
                .target_group_arn(tg.target_group_arn().unwrap_or_default())
                .send()
                .await?;
            d.insert(
                format!("nlb.tg{i}.targets"),
                health.target_health_descriptions().len().to_string(),
            );
        }
        let listeners = v2.describe_listeners().load_balancer_arn(&arn).send().await?;
        let mut l: Vec<String> = listeners
            .listeners()
            .iter()
            .map(|x| {
                normalise(
                    &format!(
                        "{:?}:{:?} -> {:?}",
                        x.protocol(),
                        x.port(),
                        x.default_actions()
                            .iter()
                            .map(|a| (a.r#type().cloned(), a.target_group_arn().map(str::to_string)))
                            .collect::<Vec<_>>()
                    ),
                    &r,
                )
            })
            .collect();
        l.sort();
        d.insert("nlb.listeners".into(), l.join(" | "));
    } else {
        let elb = moto.elb();
        let lbs = elb
            .describe_load_balancers()
            .load_balancer_names(&name)
            .send()
            .await?;
        let lb = lbs
            .load_balancer_descriptions()
            .first()
            .context("no ELB")?
            .clone();
        r.push((lb.dns_name().unwrap_or_default().to_string(), "<lb-dns>".into()));
        groups.extend(lb.security_groups().iter().cloned());
        d.insert("clb.scheme".into(), format!("{:?}", lb.scheme()));
        d.insert("clb.subnets".into(), lb.subnets().len().to_string());
        d.insert("clb.instances".into(), lb.instances().len().to_string());
        d.insert(
            "clb.security-groups".into(),
            lb.security_groups().len().to_string(),
        );
        let mut l: Vec<String> = lb
            .listener_descriptions()
            .iter()
            .filter_map(|x| x.listener())
            .map(|x| {
                normalise(
                    &format!(
                        "{}:{} -> {:?}:{} cert={:?}",
                        x.protocol(),
                        x.load_balancer_port(),
                        x.instance_protocol(),
                        x.instance_port(),
                        x.ssl_certificate_id()
                    ),
                    &r,
                )
            })
            .collect();
        l.sort();
        d.insert("clb.listeners".into(), l.join(" | "));
        d.insert(
            "clb.health-check".into(),
            normalise(
                &lb.health_check()
                    .map(|h| {
                        format!(
                            "{} interval={} timeout={} healthy={} unhealthy={}",
                            h.target(),
                            h.interval(),
                            h.timeout(),
                            h.healthy_threshold(),
                            h.unhealthy_threshold()
                        )
                    })
                    .unwrap_or_else(|| "none".into()),
                &r,
            ),
        );
        let attrs = elb
            .describe_load_balancer_attributes()
            .load_balancer_name(&name)
            .send()
            .await?;
        d.insert(
            "clb.attributes".into(),
            attrs
                .load_balancer_attributes()
                .map(|a| {
                    format!(
                        "cross-zone={:?} draining={:?}/{:?} idle={:?} access-log={:?}",
                        a.cross_zone_load_balancing().map(|c| c.enabled()),
                        a.connection_draining().map(|c| c.enabled()),
                        a.connection_draining().and_then(|c| c.timeout()),
                        a.connection_settings().map(|c| c.idle_timeout()),
                        a.access_log().map(|c| c.enabled()),
                    )
                })
                .unwrap_or_default(),
        );
        let tags = elb.describe_tags().load_balancer_names(&name).send().await?;
        let t = key_values(
            tags.tag_descriptions()
                .iter()
                .flat_map(|td| td.tags().iter().map(|t| (t.key(), t.value().unwrap_or_default()))),
        );
        d.insert("clb.tags".into(), normalise(&t, &r));
    }
    // The load balancer's own security groups, and what the node group lets in for it.
    let kind = if nlb { "nlb" } else { "clb" };
    for (i, g) in groups.iter().enumerate() {
        r.push((g.clone(), format!("<lb-group-{i}>")));
    }
    for (i, g) in groups.iter().enumerate() {
        let sgs = ec2.describe_security_groups().group_ids(g).send().await?;
        let sg = sgs.security_groups().first().context("no group")?;
        d.insert(
            format!("{kind}.group{i}.name"),
            normalise(sg.group_name().unwrap_or_default(), &r),
        );
        d.insert(
            format!("{kind}.group{i}.description"),
            normalise(sg.description().unwrap_or_default(), &r),
        );
        let mut rules: Vec<String> = sg
            .ip_permissions()
            .iter()
            .map(|p| normalise(&permission(p), &r))
            .collect();
        rules.sort();
        d.insert(format!("{kind}.group{i}.ingress"), rules.join(" | "));
        let tags = key_values(
            sg.tags()
                .iter()
                .map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default())),
        );
        d.insert(format!("{kind}.group{i}.tags"), normalise(&tags, &r));
    }
    let node_group = ec2
        .describe_security_groups()
        .group_ids(&world.security_group_id)
        .send()
        .await?;
    let mut rules: Vec<String> = node_group
        .security_groups()
        .first()
        .map(|sg| sg.ip_permissions().to_vec())
        .unwrap_or_default()
        .iter()
        .map(|p| normalise(&permission(p), &r))
        .filter(|p| p.contains("<lb-group-") || p.contains("<node-port>"))
        // Another load balancer's group admitted by the same rule is that one's business.
        .map(|p| {
            let (head, sources) = p.split_once(" from ").unwrap_or((p.as_str(), ""));
            let own: Vec<&str> = sources.split(',').filter(|s| !s.starts_with("sg-")).collect();
            format!("{head} from {}", own.join(","))
        })
        .collect();
    rules.sort();
    d.insert(format!("{kind}.node-group-ingress"), rules.join(" | "));
    Ok(d)
}

/// `key=value` pairs (attributes, tags), sorted and joined with commas.
fn key_values<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut list: Vec<String> = pairs.map(|(k, v)| format!("{k}={v}")).collect();
    list.sort();
    list.join(",")
}

fn permission(p: &aws_sdk_ec2::types::IpPermission) -> String {
    let mut sources: Vec<String> = p
        .ip_ranges()
        .iter()
        .map(|r| {
            format!(
                "{}({})",
                r.cidr_ip().unwrap_or_default(),
                r.description().unwrap_or_default()
            )
        })
        .chain(p.user_id_group_pairs().iter().map(|g| {
            format!(
                "{}({})",
                g.group_id().unwrap_or_default(),
                g.description().unwrap_or_default()
            )
        }))
        .collect();
    sources.sort();
    format!(
        "{} {:?}-{:?} from {}",
        p.ip_protocol().unwrap_or_default(),
        p.from_port(),
        p.to_port(),
        sources.join(",")
    )
}

/// Registers the instances' Nodes as a kubelet with `--cloud-provider=external` does.
async fn register(nodes: &Api<Node>, instances: &[Instance]) -> Result<()> {
    for i in instances {
        nodes
            .create(&PostParams::default(), &tainted_node(&i.private_dns_name))
            .await?;
        set_ready(nodes, &i.private_dns_name, "True").await?;
    }
    Ok(())
}

async fn initialised(nodes: &Api<Node>, name: &str) -> Result<Node> {
    wait_for(&format!("{name} initialised with addresses"), T, || async {
        let n = rcp_e2e::k8s::initialised(nodes, name).await?;
        (!k8s_cloud_provider::node::helpers::addresses(&n).is_empty()).then_some(n)
    })
    .await
}

/// Waits until `ccm` has initialised the Nodes of `instances`, then makes the Services
/// `clb-<suffix>` (Classic ELB) and `nlb-<suffix>` (NLB) and waits until both are served.
async fn nodes_and_load_balancers(
    nodes: &Api<Node>,
    services: &Api<Service>,
    instances: &[Instance],
    suffix: &str,
    ccm: &CcmProcess,
) -> Result<(Service, Service)> {
    for i in instances {
        initialised(nodes, &i.private_dns_name)
            .await
            .with_context(|| ccm.log())?;
    }
    let mut served = Vec::new();
    for (name, annotations) in [
        (format!("clb-{suffix}"), &[][..]),
        (format!("nlb-{suffix}"), &[("type", "nlb")][..]),
    ] {
        services
            .create(
                &PostParams::default(),
                &load_balancer_service(&name, annotations, &[(80, "http")]),
            )
            .await?;
        served.push(name);
    }
    let clb = wait_for_ingress(services, &served[0], T)
        .await
        .with_context(|| ccm.log())?;
    let nlb = wait_for_ingress(services, &served[1], T)
        .await
        .with_context(|| ccm.log())?;
    Ok((clb, nlb))
}

#[tokio::test]
async fn upstream_and_ours_make_the_same_nodes_and_load_balancers_and_ours_adopts_upstreams() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let moto = Moto::start().await?;
    let world = moto.build_world(CLUSTER, 4).await?;
    // Both CCMs reach moto through a proxy that adds real AWS's default health check.
    let proxy = FaultProxy::start(moto.endpoint()).await?;
    proxy.add(Rule::new(
        &["Action=DescribeLoadBalancers", "Version=2012-06-01"],
        Action::Rewrite(with_default_health_check),
    ));
    let aws = format!("http://127.0.0.1:{}", proxy.port());
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    // In each zone, one instance is upstream's Node and one is ours.
    let mut theirs: Vec<Instance> = Vec::new();
    let mut ours: Vec<Instance> = Vec::new();
    for i in &world.instances {
        if theirs.iter().any(|t| t.zone == i.zone) {
            ours.push(i.clone());
        } else {
            theirs.push(i.clone());
        }
    }
    anyhow::ensure!(
        theirs.len() == 2 && ours.len() == 2,
        "two instances in each of two zones"
    );
    let (theirs, ours) = (theirs.as_slice(), ours.as_slice());

    // Upstream: two Nodes, a Classic ELB and an NLB.
    register(&nodes, theirs).await?;
    let mut upstream = start_upstream(&cluster, &moto, &aws, &world)?;
    let (clb_up, nlb_up) = nodes_and_load_balancers(&nodes, &services, theirs, "up", &upstream).await?;
    // Upstream finishes what it is doing (its calls stop), then stops.
    let mut calls = moto.actions().len();
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = moto.actions().len();
        if now == calls {
            break;
        }
        calls = now;
    }
    upstream.signal(Signal::SIGTERM)?;
    upstream.wait_exit(Duration::from_secs(30))?;

    // Ours takes over: two proven syncs (a start and a restart), not one mutating call.
    let before = moto.actions().len();
    let first = start_ours(&cluster, &moto, &aws, &world, "ccm-aws-take-over")?;
    first
        .wait_service_reconciles(2.0, T)
        .await
        .with_context(|| first.log())?;
    let actions = moto.actions()[before..].to_vec();
    assert!(!actions.is_empty(), "ours asked moto nothing?");
    assert_eq!(
        mutating(&actions),
        Vec::<String>::new(),
        "the take-over changed something: {actions:?}\n{}",
        first.log()
    );
    drop(first);
    let before = moto.actions().len();
    let ccm = start_ours(&cluster, &moto, &aws, &world, "ccm-aws-take-over-again")?;
    ccm.wait_service_reconciles(2.0, T)
        .await
        .with_context(|| ccm.log())?;
    let actions = moto.actions()[before..].to_vec();
    assert_eq!(
        mutating(&actions),
        Vec::<String>::new(),
        "the second sync changed something: {actions:?}\n{}",
        ccm.log()
    );
    println!(
        "take-over: {} calls over two syncs, 0 mutating",
        moto.actions().len() - before
    );

    // Ours: two Nodes and the same two load balancers for Services of its own.
    register(&nodes, ours).await?;
    let (clb_ours, nlb_ours) = nodes_and_load_balancers(&nodes, &services, ours, "ours", &ccm).await?;
    // Both node sets synced: every Service's load balancer has its 4 nodes.
    ccm.wait_service_reconciles(4.0, T).await?;

    // Compare.
    let mut rows: Vec<(String, String, String)> = Vec::new();
    let mut compare = |what: &str, up: BTreeMap<String, String>, us: BTreeMap<String, String>| {
        let keys: std::collections::BTreeSet<&String> = up.keys().chain(us.keys()).collect();
        for k in keys {
            let (a, b) = (
                up.get(k).cloned().unwrap_or("—".into()),
                us.get(k).cloned().unwrap_or("—".into()),
            );
            if a != b {
                rows.push((format!("{what}: {k}"), a, b));
            }
        }
    };
    for (j, (theirs_i, ours_i)) in theirs.iter().zip(ours).enumerate() {
        let n_up = nodes.get(&theirs_i.private_dns_name).await?;
        let n_us = nodes.get(&ours_i.private_dns_name).await?;
        compare(
            &format!("node {j}"),
            describe_node(&n_up, theirs_i),
            describe_node(&n_us, ours_i),
        );
    }
    let clb_up = services
        .get(clb_up.metadata.name.as_deref().unwrap_or_default())
        .await?;
    let clb_ours = services
        .get(clb_ours.metadata.name.as_deref().unwrap_or_default())
        .await?;
    let nlb_up = services
        .get(nlb_up.metadata.name.as_deref().unwrap_or_default())
        .await?;
    let nlb_ours = services
        .get(nlb_ours.metadata.name.as_deref().unwrap_or_default())
        .await?;
    compare(
        "classic",
        describe_load_balancer(&moto, &world, &clb_up).await?,
        describe_load_balancer(&moto, &world, &clb_ours).await?,
    );
    compare(
        "nlb",
        describe_load_balancer(&moto, &world, &nlb_up).await?,
        describe_load_balancer(&moto, &world, &nlb_ours).await?,
    );
    let events = |name: &str| {
        let client = client.clone();
        let name = name.to_string();
        async move {
            let list = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client, "default")
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            // The creation's events (later ones depend on when Nodes came and went).
            let mut reasons: Vec<String> = list
                .into_iter()
                .filter(|e| e.involved_object.name.as_deref() == Some(name.as_str()))
                .filter_map(|e| e.reason)
                .filter(|r| r.starts_with("Ensur"))
                .collect();
            reasons.sort();
            reasons.dedup();
            reasons.join(",")
        }
    };
    compare(
        "classic",
        [("service.events".to_string(), events("clb-up").await)].into(),
        [("service.events".to_string(), events("clb-ours").await)].into(),
    );

    println!(
        "upstream aws-cloud-controller-manager {} vs ours: {} differences",
        upstream_version(),
        rows.len()
    );
    println!("| field | upstream | ours | why |\n|---|---|---|---|");
    for (k, a, b) in &rows {
        let why = DOCUMENTED_DIFFERENCES
            .iter()
            .find(|(field, _)| k == field)
            .map_or("NOT DOCUMENTED", |(_, why)| why);
        println!("| {k} | {a} | {b} | {why} |");
    }
    let undocumented: Vec<&(String, String, String)> = rows
        .iter()
        .filter(|(k, _, _)| !DOCUMENTED_DIFFERENCES.iter().any(|(field, _)| k == field))
        .collect();
    assert!(
        undocumented.is_empty(),
        "differences from upstream that docs/migration.md does not list: {undocumented:#?}"
    );
    Ok(())
}

fn upstream_version() -> String {
    paths::test_bin("aws-cloud-controller-manager")
        .ok()
        .and_then(|b| std::process::Command::new(b).arg("--version").output().ok())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Every flag of upstream's `--help`, with the value a manifest would give it: its default as
/// printed (`(default X)`), else the zero value of its type (Go prints no default for those).
/// Flags whose default is an empty list are left out (Go refuses an empty value for some of
/// them, e.g. `--tls-sni-cert-key`), and `--feature-gates` gets every gate at its default.
fn upstream_flags_with_values(help: &str) -> Vec<String> {
    let flag = regex::Regex::new(r"^\s+(?:-\w, )?--([a-z0-9-]+)(?: (\S+))?(?:\s{2,}(.*))?$").unwrap();
    let mut flags: Vec<(String, Option<String>, String)> = Vec::new();
    for line in help.lines() {
        if let Some(c) = flag.captures(line) {
            flags.push((
                c[1].to_string(),
                c.get(2).map(|m| m.as_str().to_string()),
                c.get(3).map(|m| m.as_str().to_string()).unwrap_or_default(),
            ));
        } else if let Some(last) = flags.last_mut()
            && line.starts_with(' ')
        {
            // A continuation of the description (indented; section titles are not).
            last.2.push(' ');
            last.2.push_str(line.trim());
        }
    }
    let default = regex::Regex::new(r#"\(default "?(.*?)"?\)\s*$"#).unwrap();
    let gate = regex::Regex::new(r"(\w+)=true\|false \((?:ALPHA|BETA) - default=(\w+)\)").unwrap();
    let mut args = Vec::new();
    for (name, kind, description) in flags {
        if ["help", "version", "kubeconfig", "cloud-provider", "cloud-config"].contains(&name.as_str()) {
            continue;
        }
        if name == "feature-gates" {
            let gates: Vec<String> = gate
                .captures_iter(&description)
                .map(|c| format!("{}={}", &c[1], &c[2]))
                .collect();
            assert!(gates.len() > 30, "upstream's gates: {description}");
            args.push(format!("--feature-gates={}", gates.join(",")));
            continue;
        }
        let value = match default.captures(&description) {
            Some(c) if &c[1] == "[]" => continue,
            Some(c) => c[1].trim_start_matches('[').trim_end_matches(']').to_string(),
            None => match kind.as_deref() {
                None => "false".into(),
                Some("int" | "int32" | "float" | "float32" | "Level" | "quantity") => "0".into(),
                Some("duration") => "0s".into(),
                Some(_) => String::new(),
            },
        };
        args.push(format!("--{name}={value}"));
    }
    args
}

/// A manifest written for upstream's AWS cloud-controller-manager starts ours unchanged: every
/// flag of its `--help` (the binary built from `k8s.io/cloud-provider-aws`), with its value,
/// passes our flag parsing and validation together, and the command goes on to read the
/// kubeconfig (the first thing after validation). An unknown feature gate is refused as
/// upstream refuses it.
#[test]
fn every_flag_of_the_upstream_aws_ccm_is_accepted() -> Result<()> {
    let upstream = paths::test_bin("aws-cloud-controller-manager")?;
    let help = std::process::Command::new(&upstream).arg("--help").output()?;
    let help = String::from_utf8_lossy(&help.stdout).to_string() + &String::from_utf8_lossy(&help.stderr);
    let mut args = upstream_flags_with_values(&help);
    assert!(args.len() > 70, "{} flags found in upstream's --help", args.len());
    let flags = args.len();
    args.push("--cloud-provider=aws".into());
    args.push("--kubeconfig=/nonexistent/kubeconfig".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, stderr) =
        run_to_exit_with_env("cloud-controller-manager-aws", &args, &[("RUST_LOG", "warn")])?;
    assert_eq!(code, 1, "{stderr}");
    for refusal in [
        "unexpected argument",
        "invalid value",
        "invalid flags",
        "a value is required",
    ] {
        assert!(!stderr.contains(refusal), "{refusal}: {stderr}");
    }
    assert!(
        stderr.contains("--kubeconfig /nonexistent/kubeconfig"),
        "{stderr}"
    );
    eprintln!("{flags} flags of {} accepted", upstream_version());

    let (code, _, stderr) = run_to_exit_with_env(
        "cloud-controller-manager-aws",
        &[
            "--feature-gates=CloudControllerManagerWebhook=true,NoSuchGate=true",
            "--kubeconfig=/nonexistent",
        ],
        &[("RUST_LOG", "warn")],
    )?;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("--feature-gates: unrecognized feature gate: NoSuchGate"),
        "{stderr}"
    );
    let (_, _, stderr) = run_to_exit_with_env(
        "cloud-controller-manager-aws",
        &[
            "--feature-gates=CloudControllerManagerWebhook=true",
            "--kubeconfig=/nonexistent",
        ],
        &[("RUST_LOG", "warn")],
    )?;
    assert!(
        stderr.contains("have no effect here") && stderr.contains("CloudControllerManagerWebhook=true"),
        "a gate set to other than its default is reported: {stderr}"
    );
    Ok(())
}
