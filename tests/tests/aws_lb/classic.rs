//! Classic ELBs: annotations, listeners and health checks, subnets, the VPC from IMDS.

use crate::aws_lb::env::*;

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
