//! The test environment of the load-balancer tests: kube-apiserver, moto with a world of
//! instances, the AWS CCM as a process (optionally through a fault proxy), and what the tests
//! read back from moto.

pub(crate) use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

pub(crate) use anyhow::Result;
pub(crate) use aws_sdk_ec2::types::Filter;
pub(crate) use k8s_cloud_provider::service::helpers::default_load_balancer_name;
pub(crate) use k8s_openapi::api::core::v1::{Node, Service};
pub(crate) use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
pub(crate) use rcp_e2e::{
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

pub(crate) const T: Duration = Duration::from_secs(90);
pub(crate) const PREFIX: &str = "service.beta.kubernetes.io/aws-load-balancer-";

pub(crate) struct Env {
    pub(crate) cluster: TestCluster,
    pub(crate) moto: Moto,
    pub(crate) world: World,
    pub(crate) nodes: Api<Node>,
    pub(crate) services: Api<Service>,
    /// EC2 resources tagged for the cluster before any Service existed (the world's own).
    pub(crate) tagged_at_start: BTreeSet<String>,
    /// The proxy between the CCM and moto, when asked for.
    pub(crate) proxy: Option<FaultProxy>,
    pub(crate) _imds: Option<ImdsStub>,
    pub(crate) _ccm: CcmProcess,
}

/// IDs of the EC2 resources tagged `kubernetes.io/cluster/e2e`.
pub(crate) async fn cluster_tagged(moto: &Moto) -> Result<BTreeSet<String>> {
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

pub(crate) async fn env(instances: usize) -> Result<Env> {
    env_with(instances, "").await
}

/// Like [`env`], with `extra_global` (lines) added to the cloud config's `[Global]` section.
pub(crate) async fn env_with(instances: usize, extra_global: &str) -> Result<Env> {
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
pub(crate) struct EnvOptions<'a> {
    /// Lines added to `[Global]`.
    pub(crate) extra_global: &'a str,
    /// No `VPC` / `SubnetID` in the config: the CCM finds its VPC through IMDS (a stub that
    /// answers as the world's first instance).
    pub(crate) vpc_from_imds: bool,
    /// The CCM reaches moto through a [`FaultProxy`].
    pub(crate) fault_proxy: bool,
    /// More command-line flags for the CCM.
    pub(crate) extra_args: &'a [&'a str],
}

pub(crate) async fn env_opts(instances: usize, o: EnvOptions<'_>) -> Result<Env> {
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
        ]
        .into_iter()
        .chain(o.extra_args.iter().map(|a| a.to_string()))
        .collect::<Vec<String>>(),
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

pub(crate) async fn ingress(services: &Api<Service>, name: &str) -> Result<Service> {
    wait_for_ingress(services, name, T).await
}

pub(crate) fn node_ports(s: &Service) -> Vec<i32> {
    s.spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .iter()
        .filter_map(|p| p.node_port)
        .collect()
}

/// Security groups other than the world's node group and the VPC's default group.
pub(crate) async fn extra_groups(env: &Env) -> Result<Vec<String>> {
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

pub(crate) async fn node_group_refs(env: &Env) -> Result<(usize, Vec<String>)> {
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
pub(crate) async fn user_group(env: &Env, name: &str) -> Result<String> {
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
pub(crate) async fn assert_user_group_untouched(env: &Env, id: &str) -> Result<()> {
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
pub(crate) async fn delete_service(env: &Env, name: &str) -> Result<()> {
    env.services.delete(name, &DeleteParams::default()).await?;
    wait_for(&format!("service {name} gone"), T, || async {
        env.services.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nCCM log (last lines, newest first):\n{}", ccm_tail(env)))
}

/// Creates the Classic-ELB Service `svc` (port 80), waits for its load balancer and returns the
/// load balancer's name and the ID of its own `k8s-elb-<name>` group.
pub(crate) async fn classic_with_group(env: &Env, svc: &str) -> Result<(String, String)> {
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
pub(crate) fn tag_spec(
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
pub(crate) fn ccm_tail(env: &Env) -> String {
    let log = env._ccm.log();
    log.lines().rev().take(40).collect::<Vec<_>>().join("\n")
}

/// `(protocol, from, to, cidr)` of every CIDR ingress rule of `g`, sorted.
pub(crate) fn cidr_rules(g: &aws_sdk_ec2::types::SecurityGroup) -> Vec<(String, i32, i32, String)> {
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

pub(crate) async fn nothing_left(env: &Env) -> Result<()> {
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
