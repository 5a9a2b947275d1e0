//! `cloud-controller-manager-aws orphans` on the real binary, kube-apiserver and moto: after two
//! Services lost their cleanup finalizer by hand and were deleted while the CCM was stopped
//! (so nothing cleaned up), it lists exactly their load balancers, target groups and security
//! groups; `--delete` without `--yes` and without a "y" deletes nothing; `--delete --yes`
//! deletes exactly them, leaving the other Service's load balancer, another cluster's load
//! balancer and the cluster's node security group alone; a second run finds nothing. With
//! `--cluster-cidr`, routes within it to a terminated instance or to an instance without a Node
//! are orphans too; a route to a Node and one outside the cluster CIDR are kept.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Result;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use nix::sys::signal::Signal;
use rcp_e2e::{
    Moto, TestCluster,
    ccm::CcmProcess,
    k8s::{load_balancer_service, register_tainted_nodes, wait_for_ingress},
};

const T: Duration = Duration::from_secs(120);
const SERVICE_TAG: &str = "kubernetes.io/service-name";

/// Every resource of the world's load balancers, as `(kind, name, service tag, cluster tags)`.
async fn inventory(moto: &Moto, vpc: &str) -> Result<Vec<(String, String, String, String)>> {
    let mut all = Vec::new();
    let clusters = |tags: &BTreeMap<String, String>| {
        tags.iter()
            .filter(|(k, _)| k.starts_with("kubernetes.io/cluster/"))
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let elb = moto.elb();
    for d in elb
        .describe_load_balancers()
        .send()
        .await?
        .load_balancer_descriptions()
    {
        let name = d.load_balancer_name().unwrap_or_default();
        let tags: BTreeMap<String, String> = elb
            .describe_tags()
            .load_balancer_names(name)
            .send()
            .await?
            .tag_descriptions()
            .iter()
            .flat_map(|t| t.tags())
            .map(|t| (t.key().to_string(), t.value().unwrap_or_default().to_string()))
            .collect();
        all.push((
            "classic-elb".into(),
            name.into(),
            tags.get(SERVICE_TAG).cloned().unwrap_or_default(),
            clusters(&tags),
        ));
    }
    let elbv2 = moto.elbv2();
    let mut arns = Vec::new();
    for lb in elbv2.describe_load_balancers().send().await?.load_balancers() {
        arns.push((
            "nlb",
            lb.load_balancer_name().unwrap_or_default().to_string(),
            lb.load_balancer_arn().unwrap_or_default().to_string(),
        ));
    }
    for tg in elbv2.describe_target_groups().send().await?.target_groups() {
        arns.push((
            "target-group",
            tg.target_group_name().unwrap_or_default().to_string(),
            tg.target_group_arn().unwrap_or_default().to_string(),
        ));
    }
    for (kind, name, arn) in arns {
        let tags: BTreeMap<String, String> = elbv2
            .describe_tags()
            .resource_arns(&arn)
            .send()
            .await?
            .tag_descriptions()
            .iter()
            .flat_map(|t| t.tags())
            .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or_default().to_string())))
            .collect();
        all.push((
            kind.into(),
            name,
            tags.get(SERVICE_TAG).cloned().unwrap_or_default(),
            clusters(&tags),
        ));
    }
    let groups = moto
        .ec2()
        .describe_security_groups()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("vpc-id")
                .values(vpc)
                .build(),
        )
        .send()
        .await?;
    for g in groups.security_groups() {
        let tags: BTreeMap<String, String> = g
            .tags()
            .iter()
            .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or_default().to_string())))
            .collect();
        if !clusters(&tags).is_empty() {
            all.push((
                "security-group".into(),
                g.group_name().unwrap_or_default().into(),
                tags.get(SERVICE_TAG).cloned().unwrap_or_default(),
                clusters(&tags),
            ));
        }
    }
    all.sort();
    Ok(all)
}

/// The destination CIDRs of the route table's routes.
async fn routes(moto: &Moto, table: &str) -> Result<Vec<String>> {
    let out = moto
        .ec2()
        .describe_route_tables()
        .route_table_ids(table)
        .send()
        .await?;
    let mut all: Vec<String> = out
        .route_tables()
        .iter()
        .flat_map(|t| t.routes())
        .filter_map(|r| r.destination_cidr_block().map(str::to_string))
        .collect();
    all.sort();
    Ok(all)
}

/// The sources the rules of `group` admit: `group <id>` or `cidr <cidr> <description>`.
async fn node_group_sources(moto: &Moto, group: &str) -> Result<Vec<String>> {
    let out = moto
        .ec2()
        .describe_security_groups()
        .group_ids(group)
        .send()
        .await?;
    Ok(out
        .security_groups()
        .iter()
        .flat_map(|g| g.ip_permissions())
        .flat_map(|p| {
            p.user_id_group_pairs()
                .iter()
                .map(|u| format!("group {}", u.group_id().unwrap_or_default()))
                .chain(p.ip_ranges().iter().map(|r| {
                    format!(
                        "cidr {} {}",
                        r.cidr_ip().unwrap_or_default(),
                        r.description().unwrap_or_default()
                    )
                }))
        })
        .collect())
}

/// Runs `cloud-controller-manager-aws orphans <args>`: `(exit code, stdout, stderr)`.
fn orphans(moto: &Moto, args: &[String]) -> Result<(i32, String, String)> {
    let mut all = vec!["orphans".to_string()];
    all.extend_from_slice(args);
    moto.run_aws_command(&all)
}

#[tokio::test]
async fn orphans_lists_and_deletes_exactly_what_no_service_owns() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let moto = Moto::start().await?;
    let world = moto.build_world("e2e", 2).await?;
    let config = cluster.dir().join("cloud.conf");
    std::fs::write(&config, moto.cloud_config(&world))?;
    let kubeconfig = cluster.ccm_kubeconfig("aws/base")?;
    let mut ccm = CcmProcess::start_with_env(
        "cloud-controller-manager-aws",
        "ccm-aws-orphans",
        &kubeconfig,
        cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--leader-elect=false".into(),
            "--cluster-name=e2e".into(),
        ],
        &moto.sdk_env(),
    )?;
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    register_tainted_nodes(&nodes, &world.node_names(), Some(T)).await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    for (name, annotations) in [
        ("kept", vec![]),
        ("gone", vec![]),
        ("gone-nlb", vec![("type", "nlb")]),
    ] {
        services
            .create(
                &PostParams::default(),
                &load_balancer_service(name, &annotations, &[(80, "http")]),
            )
            .await?;
    }
    for name in ["kept", "gone", "gone-nlb"] {
        wait_for_ingress(&services, name, T).await?;
    }
    // Another cluster's load balancer in the same account.
    moto.create_classic_elb(
        "other-cluster-lb",
        &world.subnets[0].1,
        &[
            ("kubernetes.io/cluster/other", "owned"),
            (SERVICE_TAG, "default/gone"),
        ],
    )
    .await?;

    // The CCM stops; the two Services lose their finalizer by hand and are deleted.
    ccm.signal(Signal::SIGTERM)?;
    ccm.wait_exit(Duration::from_secs(30))?;
    for name in ["gone", "gone-nlb"] {
        services
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({"metadata": {"finalizers": null}})),
            )
            .await?;
        services.delete(name, &DeleteParams::default()).await?;
    }
    // Routes of the cluster's table: to a terminated instance and to an instance without a
    // Node (orphans), to a Node's instance, and one outside the cluster CIDR (kept).
    let extra = moto.run_instances(&world, 2).await?;
    for (cidr, instance) in [
        ("10.244.50.0/24", &extra[0].id),
        ("10.244.51.0/24", &extra[1].id),
        ("10.244.52.0/24", &world.instances[0].id),
        ("192.168.7.0/24", &extra[1].id),
    ] {
        moto.ec2()
            .create_route()
            .route_table_id(&world.route_table_id)
            .destination_cidr_block(cidr)
            .instance_id(instance)
            .send()
            .await?;
    }
    moto.ec2()
        .terminate_instances()
        .instance_ids(&extra[0].id)
        .send()
        .await?;
    // The CCM's permission (every protocol) on the node group for a security group that was
    // deleted since, and the rules for the clients of an NLB that is gone (what a CCM killed
    // between the two deletions leaves).
    let deleted_source = moto
        .ec2()
        .create_security_group()
        .group_name("deleted-source")
        .description("a group deleted after a node-group rule named it")
        .vpc_id(&world.vpc_id)
        .send()
        .await?
        .group_id()
        .unwrap_or_default()
        .to_string();
    let node_group = &world.security_group_id;
    moto.ec2()
        .authorize_security_group_ingress()
        .group_id(node_group)
        .ip_permissions(
            aws_sdk_ec2::types::IpPermission::builder()
                .ip_protocol("-1")
                .user_id_group_pairs(
                    aws_sdk_ec2::types::UserIdGroupPair::builder()
                        .group_id(&deleted_source)
                        .build(),
                )
                .build(),
        )
        .send()
        .await?;
    moto.ec2()
        .delete_security_group()
        .group_id(&deleted_source)
        .send()
        .await?;
    let gone_nlb = "a00000000000000000000000000dead1";
    moto.ec2()
        .authorize_security_group_ingress()
        .group_id(node_group)
        .ip_permissions(
            aws_sdk_ec2::types::IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(30001)
                .to_port(30001)
                .ip_ranges(
                    aws_sdk_ec2::types::IpRange::builder()
                        .cidr_ip("10.9.0.0/16")
                        .description(format!("kubernetes.io/rule/nlb/client={gone_nlb}"))
                        .build(),
                )
                .build(),
        )
        .send()
        .await?;
    let stale_rules = [
        ("sg-rule".to_string(), format!("{node_group}/{deleted_source}")),
        ("sg-rule".to_string(), format!("{node_group}/nlb={gone_nlb}")),
    ];
    let routes_before = routes(&moto, &world.route_table_id).await?;
    let before = inventory(&moto, &world.vpc_id).await?;
    let ours = |service: &str| {
        before
            .iter()
            .filter(|(_, _, s, c)| s == service && c == "kubernetes.io/cluster/e2e=owned")
            .map(|(k, n, _, _)| (k.clone(), n.clone()))
            .collect::<Vec<_>>()
    };
    let mut expected = ours("default/gone");
    expected.extend(ours("default/gone-nlb"));
    expected.extend(["10.244.50.0/24", "10.244.51.0/24"].map(|c| ("route".to_string(), c.to_string())));
    expected.extend(stale_rules.iter().cloned());
    expected.sort();
    println!("left behind: {expected:#?}");
    assert!(expected.iter().any(|(k, _)| k == "classic-elb"), "{before:#?}");
    assert!(expected.iter().any(|(k, _)| k == "nlb"), "{before:#?}");
    assert!(expected.iter().any(|(k, _)| k == "target-group"), "{before:#?}");
    assert!(expected.iter().any(|(k, _)| k == "security-group"), "{before:#?}");

    let args = vec![
        format!("--cloud-config={}", config.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        "--cluster-name=e2e".to_string(),
        "--cluster-cidr=10.244.0.0/16".to_string(),
    ];
    let (code, out, err) = orphans(&moto, &args)?;
    println!("{out}");
    assert_eq!(code, 0, "{err}");
    let mut listed: Vec<(String, String)> = out
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut cols = l.split_whitespace();
            let kind = cols.next()?;
            let name = cols.next()?;
            matches!(
                kind,
                "classic-elb" | "nlb" | "target-group" | "security-group" | "route" | "sg-rule"
            )
            .then(|| (kind.to_string(), name.to_string()))
        })
        .collect();
    listed.sort();
    assert_eq!(
        listed, expected,
        "exactly what the two Services left behind:\n{out}"
    );
    assert!(out.contains("Service default/gone does not exist"), "{out}");

    // --delete without --yes and without a "y" on stdin deletes nothing.
    let mut ask = args.clone();
    ask.push("--delete".into());
    let (code, out, err) = orphans(&moto, &ask)?;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Nothing deleted."), "{out}");
    assert_eq!(inventory(&moto, &world.vpc_id).await?, before);
    assert_eq!(routes(&moto, &world.route_table_id).await?, routes_before);

    let mut delete = ask.clone();
    delete.push("--yes".into());
    let (code, out, err) = orphans(&moto, &delete)?;
    println!("{out}");
    assert_eq!(code, 0, "{out}\n{err}");
    let after = inventory(&moto, &world.vpc_id).await?;
    let gone: Vec<_> = before
        .iter()
        .filter(|r| !after.contains(r))
        .map(|(k, n, _, _)| (k.clone(), n.clone()))
        .collect();
    let routes_after = routes(&moto, &world.route_table_id).await?;
    let mut gone: Vec<_> = gone;
    gone.extend(
        routes_before
            .iter()
            .filter(|r| !routes_after.contains(r))
            .map(|r| ("route".to_string(), r.clone())),
    );
    let node_rules = node_group_sources(&moto, node_group).await?;
    for (kind, name) in &stale_rules {
        let source = name.rsplit('/').next().unwrap_or_default();
        if !node_rules.iter().any(|r| r.contains(source)) {
            gone.push((kind.clone(), name.clone()));
        }
    }
    gone.sort();
    assert_eq!(gone, expected, "deleted exactly the orphans");
    assert!(
        node_rules
            .iter()
            .any(|r| r.contains("k8s-elb-") || r.starts_with("group sg-")),
        "the kept load balancer's rule stays: {node_rules:?}"
    );
    assert!(
        routes_after.iter().any(|r| r == "10.244.52.0/24")
            && routes_after.iter().any(|r| r == "192.168.7.0/24")
    );
    assert!(
        after
            .iter()
            .any(|(k, n, _, _)| k == "classic-elb" && n == "other-cluster-lb")
    );
    let kept = services.get("kept").await?;
    let kept_lb = k8s_cloud_provider::service::helpers::default_load_balancer_name(&kept);
    assert!(
        after
            .iter()
            .any(|(k, n, _, _)| k == "classic-elb" && *n == kept_lb),
        "{after:#?}"
    );
    let (code, out, _) = orphans(&moto, &args)?;
    assert_eq!(code, 0);
    assert!(out.starts_with("No orphans"), "{out}");
    Ok(())
}

/// A cluster whose Nodes have kubeadm-style short names (`worker-0…`, provider IDs set, the
/// instances' private DNS names are something else), whose CCM runs with `--cluster-name=e2e`
/// and `NLBSecurityGroupMode = Managed`: `orphans` lists no live route, group or rule (without
/// any cluster name: the listing does not use one), `--delete` refuses without the cluster name
/// and with one that the running CCM's Pod contradicts, and with the name read from that Pod
/// deletes exactly the true orphans — moto's request log shows no other mutation.
#[tokio::test]
async fn orphans_never_touch_live_routes_groups_or_rules() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let moto = Moto::start().await?;
    let world = moto.build_world("e2e", 3).await?;
    let config = cluster.dir().join("cloud.conf");
    std::fs::write(
        &config,
        moto.cloud_config(&world)
            .replacen("[Global]\n", "[Global]\nNLBSecurityGroupMode = Managed\n", 1),
    )?;
    let kubeconfig = cluster.ccm_kubeconfig("aws/base")?;
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let mut workers = Vec::new();
    for (i, instance) in world.instances.iter().enumerate() {
        let name = format!("worker-{i}");
        assert_ne!(name, instance.private_dns_name);
        nodes
            .create(
                &PostParams::default(),
                &rcp_e2e::k8s::node_with_provider_id(&name, &instance.provider_id()),
            )
            .await?;
        rcp_e2e::k8s::set_ready(&nodes, &name, "True").await?;
        workers.push((name, instance.id.clone()));
    }
    let mut ccm = CcmProcess::start_with_env(
        "cloud-controller-manager-aws",
        "ccm-aws-orphans-live",
        &kubeconfig,
        cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--leader-elect=false".into(),
            "--cluster-name=e2e".into(),
        ],
        &moto.sdk_env(),
    )?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    for (name, annotations) in [
        ("live-nlb", vec![("type", "nlb")]),
        ("gone-nlb", vec![("type", "nlb")]),
        ("live-clb", vec![]),
    ] {
        services
            .create(
                &PostParams::default(),
                &load_balancer_service(name, &annotations, &[(80, "http")]),
            )
            .await?;
    }
    for name in ["live-nlb", "gone-nlb", "live-clb"] {
        wait_for_ingress(&services, name, T).await?;
    }
    let lb_name = |svc: &Service| k8s_cloud_provider::service::helpers::default_load_balancer_name(svc);
    let live_nlb = lb_name(&services.get("live-nlb").await?);
    let gone = services.get("gone-nlb").await?;
    let gone_nlb = lb_name(&gone);
    let v2 = moto.elbv2();
    let groups_of = |name: String| {
        let v2 = v2.clone();
        async move {
            let out = v2.describe_load_balancers().names(name).send().await?;
            anyhow::Ok((
                out.load_balancers()[0]
                    .load_balancer_arn()
                    .unwrap_or_default()
                    .to_string(),
                out.load_balancers()[0].security_groups().to_vec(),
            ))
        }
    };
    let (_, live_groups) = groups_of(live_nlb.clone()).await?;
    let (gone_arn, gone_groups) = groups_of(gone_nlb.clone()).await?;
    assert_eq!(live_groups.len(), 1, "the live NLB has its managed group");
    assert_eq!(gone_groups.len(), 1, "the gone NLB has its managed group");
    let gone_tgs: Vec<String> = v2
        .describe_target_groups()
        .load_balancer_arn(&gone_arn)
        .send()
        .await?
        .target_groups()
        .iter()
        .filter_map(|t| t.target_group_arn().map(str::to_string))
        .collect();

    // The CCM stops; gone-nlb loses its finalizer by hand and is deleted.
    ccm.signal(Signal::SIGTERM)?;
    ccm.wait_exit(Duration::from_secs(30))?;
    services
        .patch(
            "gone-nlb",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    services.delete("gone-nlb", &DeleteParams::default()).await?;
    // Pod routes: one per worker (live), one to an instance without a Node (an orphan).
    let extra = moto.run_instances(&world, 1).await?;
    for (i, (_, instance)) in workers.iter().enumerate() {
        moto.ec2()
            .create_route()
            .route_table_id(&world.route_table_id)
            .destination_cidr_block(format!("10.244.{i}.0/24"))
            .instance_id(instance)
            .send()
            .await?;
    }
    moto.ec2()
        .create_route()
        .route_table_id(&world.route_table_id)
        .destination_cidr_block("10.244.9.0/24")
        .instance_id(&extra[0].id)
        .send()
        .await?;
    let routes_before = routes(&moto, &world.route_table_id).await?;
    let node_rules_before = node_group_sources(&moto, &world.security_group_id).await?;

    // The listing, without any cluster name, as the cluster's administrator runs it.
    let listing = vec![
        format!("--cloud-config={}", config.display()),
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        "--cluster-cidr=10.244.0.0/16".to_string(),
    ];
    let (code, out, err) = orphans(&moto, &listing)?;
    println!("{out}");
    assert_eq!(code, 0, "{err}");
    let mut listed: Vec<(String, String)> = out
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut cols = l.split_whitespace();
            let kind = cols.next()?.to_string();
            let _name = cols.next()?;
            let id = cols.next()?.to_string();
            matches!(
                kind.as_str(),
                "classic-elb" | "nlb" | "target-group" | "security-group" | "route" | "sg-rule"
            )
            .then_some((kind, id))
        })
        .collect();
    listed.sort();
    let mut expected: Vec<(String, String)> = vec![
        ("nlb".into(), gone_arn.clone()),
        ("security-group".into(), gone_groups[0].clone()),
        ("route".into(), "10.244.9.0/24".into()),
    ];
    expected.extend(gone_tgs.iter().map(|t| ("target-group".to_string(), t.clone())));
    expected.sort();
    assert_eq!(listed, expected, "exactly the true orphans:\n{out}");

    // --delete without a cluster name and no CCM Pod to read it from: refused, nothing changes.
    let before = moto.requests().len();
    let mut delete = listing.clone();
    delete.extend(["--delete".to_string(), "--yes".to_string()]);
    let (code, out, err) = orphans(&moto, &delete)?;
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(err.contains("--delete needs the CCM's cluster name"), "{err}");
    assert_eq!(moto.mutations_since(before), vec![]);

    // The CCM as a Pod in kube-system (never scheduled here; its spec is what counts).
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "kube-system");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cloud-controller-manager-abcde"},
            "spec": {
                "serviceAccountName": "cloud-controller-manager",
                "automountServiceAccountToken": false,
                "containers": [{
                    "name": "cloud-controller-manager",
                    "image": "cloud-controller-manager-aws:test",
                    "command": ["/cloud-controller-manager-aws"],
                    "args": ["--cloud-provider=aws", "--cluster-name=e2e", "--cluster-cidr=10.244.0.0/16", "--leader-elect=true"]
                }]
            }
        }))?,
    )
    .await?;
    // A stated name the running CCM contradicts: refused, nothing changes.
    let mut contradicted = delete.clone();
    contradicted.push("--cluster-name=kubernetes".into());
    let (code, out, err) = orphans(&moto, &contradicted)?;
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        err.contains("--cluster-name=kubernetes but the CCM in Pod kube-system/cloud-controller-manager-abcde runs with --cluster-name=e2e"),
        "{err}"
    );
    assert_eq!(moto.mutations_since(before), vec![]);
    // A --cluster-cidr wider than the running CCM's (it would take in routes that are not the
    // cluster's): refused, nothing changes.
    let mut wider: Vec<String> = delete
        .iter()
        .filter(|a| !a.starts_with("--cluster-cidr="))
        .cloned()
        .collect();
    wider.push("--cluster-cidr=10.0.0.0/8".into());
    let (code, out, err) = orphans(&moto, &wider)?;
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        err.contains("--cluster-cidr=10.0.0.0/8 but the CCM in Pod kube-system/cloud-controller-manager-abcde runs with --cluster-cidr=10.244.0.0/16"),
        "{err}"
    );
    assert_eq!(moto.mutations_since(before), vec![]);

    // The name read from the Pod: exactly the true orphans go.
    let (code, out, err) = orphans(&moto, &delete)?;
    println!("{out}");
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains(
            "Cluster name \"e2e\", as the CCM in Pod kube-system/cloud-controller-manager-abcde runs with."
        ),
        "{out}"
    );
    assert!(out.contains("Deletion plan"), "{out}");
    assert!(
        out.contains(
            "Same cluster: the instances of the cluster's 3 Node(s) carry the tag kubernetes.io/cluster/e2e."
        ),
        "{out}"
    );
    let mutations = moto.mutations_since(before);
    println!("{mutations:#?}");
    for (action, params) in &mutations {
        let target = |key: &str| params.get(key).cloned().unwrap_or_default();
        match action.as_str() {
            "DeleteLoadBalancer" => assert_eq!(target("LoadBalancerArn"), gone_arn),
            "DeleteListener" => {} // listeners of the gone NLB (checked by what is left below)
            "DeleteTargetGroup" => assert!(gone_tgs.contains(&target("TargetGroupArn")), "{params:?}"),
            "DeleteSecurityGroup" => assert_eq!(target("GroupId"), gone_groups[0]),
            "DeleteRoute" => assert_eq!(target("DestinationCidrBlock"), "10.244.9.0/24"),
            "RevokeSecurityGroupIngress" => {
                // Only rules that name the gone NLB.
                let described: Vec<&String> = params
                    .iter()
                    .filter(|(k, _)| k.ends_with(".Description"))
                    .map(|(_, v)| v)
                    .collect();
                assert!(
                    !described.is_empty() && described.iter().all(|d| d.ends_with(&format!("={gone_nlb}"))),
                    "{params:?}"
                );
            }
            other => panic!("unexpected mutation {other}: {params:?}"),
        }
    }
    assert!(mutations.iter().any(|(a, _)| a == "DeleteLoadBalancer"));
    assert!(mutations.iter().any(|(a, _)| a == "DeleteSecurityGroup"));
    assert!(mutations.iter().any(|(a, _)| a == "DeleteRoute"));
    // What is alive is as it was.
    let routes_after = routes(&moto, &world.route_table_id).await?;
    let mut expected_routes = routes_before.clone();
    expected_routes.retain(|r| r != "10.244.9.0/24");
    assert_eq!(routes_after, expected_routes);
    let node_rules_after = node_group_sources(&moto, &world.security_group_id).await?;
    let mut expected_rules = node_rules_before.clone();
    expected_rules.retain(|r| !r.ends_with(&format!("={gone_nlb}")));
    assert_eq!(node_rules_after, expected_rules);
    let (_, live_groups_after) = groups_of(live_nlb.clone()).await?;
    assert_eq!(live_groups_after, live_groups);
    let (code, out, _) = orphans(&moto, &listing)?;
    assert_eq!(code, 0);
    assert!(out.starts_with("No orphans"), "{out}");
    Ok(())
}
