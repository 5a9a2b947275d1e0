//! Security groups: the node group's rules (path-MTU rules shared by NLBs), managed and
//! bring-your-own load-balancer groups, users' groups and `shared` tags, never modified.

use crate::aws_lb::env::*;

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

/// Issue 12 item 5: a user's group (not tagged for the cluster) that admits a cluster load
/// balancer's group is never modified, not even when that load balancer goes: while the user's
/// rule names the load balancer's own group, nothing is deleted (the deletion fails with an
/// event naming the rule and is retried, the Service keeps its finalizer); once the user
/// removed the rule, the load balancer and its group go.
#[tokio::test]
async fn a_users_group_referencing_a_cluster_lb_group_is_never_modified() -> Result<()> {
    let env = env(2).await?;
    let (lb, lb_group) = classic_with_group(&env, "refd").await?;
    let ec2 = env.moto.ec2();
    let user = user_group(&env, "user-db").await?;
    let users_rule = aws_sdk_ec2::types::IpPermission::builder()
        .ip_protocol("tcp")
        .from_port(5432)
        .to_port(5432)
        .user_id_group_pairs(
            aws_sdk_ec2::types::UserIdGroupPair::builder()
                .group_id(&lb_group)
                .build(),
        )
        .build();
    ec2.authorize_security_group_ingress()
        .group_id(&user)
        .ip_permissions(users_rule.clone())
        .send()
        .await?;
    let users_rules = || async {
        anyhow::Ok(
            ec2.describe_security_groups()
                .group_ids(&user)
                .send()
                .await?
                .security_groups()[0]
                .ip_permissions()
                .to_vec(),
        )
    };
    let before = users_rules().await?;
    env.services.delete("refd", &Default::default()).await?;
    let client = env.cluster.client().await?;
    rcp_e2e::k8s::wait_for_event(&client, "default", "refd", T, |_, message| {
        message.contains(&format!("its security group {lb_group} is named by rules"))
            && message.contains(&format!("{user}: every rule naming {lb_group}"))
    })
    .await?;
    assert!(
        env.moto
            .elb()
            .describe_load_balancers()
            .load_balancer_names(&lb)
            .send()
            .await
            .is_ok(),
        "the load balancer is kept meanwhile"
    );
    assert!(
        env.services.get_opt("refd").await?.is_some(),
        "the finalizer is held"
    );
    assert_eq!(before, users_rules().await?, "the user's group was modified");
    // The user removes their rule: the retried deletion finishes.
    ec2.revoke_security_group_ingress()
        .group_id(&user)
        .ip_permissions(users_rule)
        .send()
        .await?;
    wait_for("service refd gone", T, || async {
        env.services.get_opt("refd").await.ok()?.is_none().then_some(())
    })
    .await?;
    env.moto
        .ec2()
        .delete_security_group()
        .group_id(&user)
        .send()
        .await?;
    nothing_left(&env).await
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

/// Two NLBs deleted at once (`--concurrent-service-syncs=2`), every `DescribeSecurityGroups`
/// answered 1 s after moto read the groups, so that both deletions read the node group before
/// either changes it.
/// The path-MTU rule they share goes with the last of them: without the provider's lock on the
/// NLB node rules each deletion saw the other's client rule (which the other was revoking)
/// and kept the rule, left behind for no NLB.
#[tokio::test]
async fn two_nlbs_deleted_at_once_leave_no_path_mtu_rule() -> Result<()> {
    let env = env_opts(
        2,
        EnvOptions {
            fault_proxy: true,
            extra_args: &["--concurrent-service-syncs=2"],
            ..Default::default()
        },
    )
    .await?;
    let proxy = env.proxy.as_ref().expect("proxy");
    for svc in ["left", "right"] {
        env.services
            .create(
                &PostParams::default(),
                &load_balancer_service(svc, &[("type", "nlb")], &[(80, "http")]),
            )
            .await?;
    }
    for svc in ["left", "right"] {
        ingress(&env.services, svc).await?;
    }
    assert_eq!(
        mtu_rules(&env, "0.0.0.0/0").await?,
        ["kubernetes.io/rule/nlb/mtu"],
        "one path-MTU rule for both"
    );
    proxy.add(Rule::new(
        &["Action=DescribeSecurityGroups"],
        Action::DelayAnswer(Duration::from_secs(1)),
    ));
    let none = DeleteParams::default();
    let (left, right) = tokio::join!(
        env.services.delete("left", &none),
        env.services.delete("right", &none)
    );
    left?;
    right?;
    nothing_left(&env).await?;
    assert_eq!(
        mtu_rules(&env, "0.0.0.0/0").await?,
        Vec::<String>::new(),
        "the path-MTU rule is left for no NLB"
    );
    Ok(())
}

/// A changed source range of an NLB: the nodes' rule for the new range is granted before the
/// rule for the old one is revoked, so the nodes never admit neither (for a Service that is not
/// covered by an open client rule, the health checks go the same way).
#[tokio::test]
async fn a_changed_source_range_is_granted_before_the_old_one_is_revoked() -> Result<()> {
    let env = env(1).await?;
    let mut svc = load_balancer_service("ranged", &[("type", "nlb")], &[(80, "http")]);
    svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["10.1.0.0/16".into()]);
    env.services.create(&PostParams::default(), &svc).await?;
    ingress(&env.services, "ranged").await?;
    let node_group = env.world.security_group_id.clone();
    let client_cidrs = || async {
        let out = env
            .moto
            .ec2()
            .describe_security_groups()
            .group_ids(&node_group)
            .send()
            .await?;
        anyhow::Ok(
            out.security_groups()
                .iter()
                .flat_map(|g| g.ip_permissions())
                .filter(|p| p.ip_protocol() == Some("tcp"))
                .flat_map(|p| p.ip_ranges())
                .filter(|r| {
                    r.description()
                        .unwrap_or_default()
                        .starts_with("kubernetes.io/rule/nlb/client=")
                })
                .filter_map(|r| r.cidr_ip().map(str::to_string))
                .collect::<Vec<_>>(),
        )
    };
    assert_eq!(client_cidrs().await?, ["10.1.0.0/16"]);
    let before = env.moto.requests().len();
    env.services
        .patch(
            "ranged",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"spec": {"loadBalancerSourceRanges": ["10.2.0.0/16"]}})),
        )
        .await?;
    wait_for("the new range on the nodes, the old one gone", T, || async {
        (client_cidrs().await.ok()? == ["10.2.0.0/16"]).then_some(())
    })
    .await?;
    let mutations = env.moto.mutations_since(before);
    let position = |action: &str, cidr: &str| {
        mutations.iter().position(|(a, p)| {
            a == action && p.get("GroupId") == Some(&node_group) && p.values().any(|v| v == cidr)
        })
    };
    let granted = position("AuthorizeSecurityGroupIngress", "10.2.0.0/16");
    let revoked = position("RevokeSecurityGroupIngress", "10.1.0.0/16");
    println!("{mutations:#?}");
    assert!(
        matches!((granted, revoked), (Some(g), Some(r)) if g < r),
        "granted at {granted:?}, revoked at {revoked:?}"
    );
    delete_service(&env, "ranged").await?;
    nothing_left(&env).await
}
