//! `cloud-controller-manager-aws orphans --delete` against what must never be lost, on the real
//! binary, kube-apiserver and moto; in each, moto's request log shows what was touched:
//! - a Classic ELB whose Service named a cluster-owned group (EKS' cluster group) in
//!   `extra-security-groups`: that group, its self-reference and the node rules naming it stay;
//!   only the group the CCM made for the load balancer goes, and one that a user's rule names
//!   stays with that rule;
//! - a kubeconfig of one cluster paired with the cloud config of another: refused, no call;
//! - Services in a switch between load-balancer kinds, or moved to another controller: the load
//!   balancer their status shows is no orphan;
//! - a prompt nobody answers (refused at the deadline), and a Service that wants its load
//!   balancer again while the prompt waits: it keeps it.

use std::{
    io::{Read, Write},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result};
use aws_sdk_ec2::types::{IpPermission, ResourceType, Tag, TagSpecification, UserIdGroupPair};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use nix::sys::signal::Signal;
use rcp_e2e::{
    Moto, TestCluster,
    ccm::CcmProcess,
    k8s::{load_balancer_service, register_tainted_nodes, wait_for_ingress},
    paths,
};

const T: Duration = Duration::from_secs(120);

/// Runs `cloud-controller-manager-aws orphans <args>`: `(exit code, stdout, stderr)`.
fn orphans(moto: &Moto, args: &[String]) -> Result<(i32, String, String)> {
    let mut all = vec!["orphans".to_string()];
    all.extend_from_slice(args);
    moto.run_aws_command(&all)
}

/// A cluster with the AWS CCM running on moto, its Nodes initialised; the arguments `orphans`
/// needs for it.
struct Setup {
    cluster: TestCluster,
    moto: Moto,
    world: rcp_e2e::moto::World,
    ccm: CcmProcess,
    args: Vec<String>,
}

async fn setup(name: &str) -> Result<Setup> {
    let (cluster, moto) = tokio::try_join!(TestCluster::start(), Moto::start())?;
    let world = moto.build_world("e2e", 2).await?;
    let config = cluster.dir().join("cloud.conf");
    std::fs::write(&config, moto.cloud_config(&world))?;
    let kubeconfig = cluster.ccm_kubeconfig("aws/base")?;
    let ccm = CcmProcess::start_with_env(
        "cloud-controller-manager-aws",
        name,
        &kubeconfig,
        cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--leader-elect=false".into(),
            "--cluster-name=e2e".into(),
        ],
        &moto.sdk_env(),
    )?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    register_tainted_nodes(&nodes, &world.node_names(), Some(T)).await?;
    let args = vec![
        format!("--cloud-config={}", config.display()),
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        "--cluster-name=e2e".to_string(),
    ];
    Ok(Setup {
        cluster,
        moto,
        world,
        ccm,
        args,
    })
}

/// Stops the CCM (SIGTERM) and waits for its exit.
fn stop(ccm: &mut CcmProcess) -> Result<()> {
    ccm.signal(Signal::SIGTERM)?;
    ccm.wait_exit(Duration::from_secs(30))?;
    Ok(())
}

impl Setup {
    fn delete_args(&self, extra: &[&str]) -> Vec<String> {
        let mut a = self.args.clone();
        a.push("--delete".into());
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }
}

/// The IDs of the security groups of the Classic ELB `name`.
async fn classic_groups(moto: &Moto, name: &str) -> Result<Vec<String>> {
    let out = moto
        .elb()
        .describe_load_balancers()
        .load_balancer_names(name)
        .send()
        .await?;
    Ok(out
        .load_balancer_descriptions()
        .first()
        .map(|d| d.security_groups().to_vec())
        .unwrap_or_default())
}

/// Every ingress rule of `group`, as `protocol from-to source`.
async fn rules_of(moto: &Moto, group: &str) -> Result<Vec<String>> {
    let out = moto
        .ec2()
        .describe_security_groups()
        .group_ids(group)
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
                p.from_port().unwrap_or(-1),
                p.to_port().unwrap_or(-1)
            );
            p.user_id_group_pairs()
                .iter()
                .map(move |u| format!("{head} {}", u.group_id().unwrap_or_default()))
        })
        .collect();
    rules.sort();
    Ok(rules)
}

async fn group_exists(moto: &Moto, group: &str) -> Result<bool> {
    Ok(moto
        .ec2()
        .describe_security_groups()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("group-id")
                .values(group)
                .build(),
        )
        .send()
        .await?
        .security_groups()
        .iter()
        .any(|g| g.group_id() == Some(group)))
}

fn group_permission(protocol: &str, port: Option<i32>, source: &str) -> IpPermission {
    IpPermission::builder()
        .ip_protocol(protocol)
        .set_from_port(port)
        .set_to_port(port)
        .user_id_group_pairs(UserIdGroupPair::builder().group_id(source).build())
        .build()
}

/// Removes the cleanup finalizer by hand and deletes the Service (the CCM is stopped: nothing
/// cleans up).
async fn delete_by_hand(services: &Api<Service>, name: &str) -> Result<()> {
    services
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    services.delete(name, &Default::default()).await?;
    Ok(())
}

/// EKS tags its cluster security group `kubernetes.io/cluster/<name>=owned`; a Service naming it
/// in `extra-security-groups` puts it on its Classic ELB. Once that Service is gone, `orphans
/// --delete` deletes the load balancer and the group the CCM made for it, and leaves the
/// cluster group as it was: its reference to itself (what lets the cluster's members talk), the
/// node rules naming it, its tags. A second orphan load balancer's own group is named by a
/// user's port rule on the nodes: the CCM's permission goes, the user's rule and so the group
/// stay (reported, exit 1).
#[tokio::test]
async fn a_cluster_owned_group_a_service_named_and_a_users_rule_survive_the_orphans_deletion() -> Result<()> {
    let mut s = setup("ccm-aws-orphans-groups").await?;
    let moto = &s.moto;
    let ec2 = moto.ec2();
    let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
    let eks = ec2
        .create_security_group()
        .group_name("eks-cluster-sg-e2e")
        .description("EKS created security group applied to ENI that is attached to EKS Control Plane master nodes, as well as any managed workloads.")
        .vpc_id(&s.world.vpc_id)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::SecurityGroup)
                .tags(tag("kubernetes.io/cluster/e2e", "owned"))
                .build(),
        )
        .send()
        .await?
        .group_id()
        .context("no group id")?
        .to_string();
    let node_group = s.world.security_group_id.clone();
    ec2.authorize_security_group_ingress()
        .group_id(&eks)
        .ip_permissions(group_permission("-1", None, &eks))
        .send()
        .await?;
    ec2.authorize_security_group_ingress()
        .group_id(&node_group)
        .ip_permissions(group_permission("-1", None, &eks))
        .ip_permissions(group_permission("tcp", Some(10250), &eks))
        .send()
        .await?;

    let client = s.cluster.client().await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .create(
            &PostParams::default(),
            &load_balancer_service(
                "extra",
                &[("extra-security-groups", eks.as_str())],
                &[(80, "http")],
            ),
        )
        .await?;
    services
        .create(
            &PostParams::default(),
            &load_balancer_service("user-rule", &[], &[(80, "http")]),
        )
        .await?;
    let extra_lb = k8s_cloud_provider::service::helpers::default_load_balancer_name(
        &wait_for_ingress(&services, "extra", T).await?,
    );
    let user_lb = k8s_cloud_provider::service::helpers::default_load_balancer_name(
        &wait_for_ingress(&services, "user-rule", T).await?,
    );
    let extra_groups = classic_groups(moto, &extra_lb).await?;
    let own_extra = extra_groups
        .iter()
        .find(|g| **g != eks)
        .context("the CCM's group of extra")?
        .clone();
    assert!(extra_groups.contains(&eks), "{extra_groups:?}");
    let own_user = classic_groups(moto, &user_lb).await?[0].clone();
    // A user opened a port of the nodes to the second load balancer's group.
    ec2.authorize_security_group_ingress()
        .group_id(&node_group)
        .ip_permissions(group_permission("tcp", Some(8443), &own_user))
        .send()
        .await?;
    let eks_rules = rules_of(moto, &eks).await?;
    let node_rules = rules_of(moto, &node_group).await?;
    assert!(
        node_rules.contains(&format!("-1 -1--1 {own_extra}")),
        "{node_rules:?}"
    );
    assert!(
        node_rules.contains(&format!("-1 -1--1 {own_user}")),
        "{node_rules:?}"
    );

    stop(&mut s.ccm)?;
    delete_by_hand(&services, "extra").await?;
    delete_by_hand(&services, "user-rule").await?;

    let (code, out, err) = orphans(moto, &s.args)?;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(!out.contains(&eks), "the cluster group is no orphan:\n{out}");
    assert!(out.contains(&own_extra) && out.contains(&own_user), "{out}");

    let before = moto.requests().len();
    let (code, out, err) = orphans(moto, &s.delete_args(&["--yes"]))?;
    println!("{out}\n{err}");
    assert_eq!(
        code, 1,
        "the group a user's rule names is reported:\n{out}\n{err}"
    );
    assert!(
        out.contains(&format!(
            "FAILED to delete security-group k8s-elb-{user_lb} ({own_user})"
        )),
        "{out}"
    );
    let mutations = moto.mutations_since(before);
    println!("{mutations:#?}");
    for (action, params) in &mutations {
        let get = |k: &str| params.get(k).cloned().unwrap_or_default();
        assert!(
            !params.values().any(|v| *v == eks),
            "the cluster group was named in {action}: {params:?}"
        );
        match action.as_str() {
            "DeleteLoadBalancer" => assert!([&extra_lb, &user_lb].contains(&&get("LoadBalancerName"))),
            "DeleteSecurityGroup" => assert_eq!(get("GroupId"), own_extra),
            "RevokeSecurityGroupIngress" => {
                assert_eq!(get("GroupId"), node_group, "{params:?}");
                assert_eq!(
                    get("IpPermissions.1.IpProtocol"),
                    "-1",
                    "only the CCM's permission: {params:?}"
                );
            }
            other => panic!("unexpected mutation {other}: {params:?}"),
        }
    }
    assert!(!group_exists(moto, &own_extra).await?);
    assert!(group_exists(moto, &own_user).await?);
    assert!(group_exists(moto, &eks).await?);
    assert_eq!(rules_of(moto, &eks).await?, eks_rules, "the self-reference stays");
    let mut want = node_rules.clone();
    want.retain(|r| *r != format!("-1 -1--1 {own_extra}") && *r != format!("-1 -1--1 {own_user}"));
    assert_eq!(rules_of(moto, &node_group).await?, want);
    assert!(want.contains(&format!("tcp 8443-8443 {own_user}")), "{want:?}");
    Ok(())
}

/// The kubeconfig of a cluster whose Nodes run on instances tagged for another cluster, with
/// the cloud config of cluster `e2e`: the listing lists `e2e`'s orphan, `--delete` refuses and
/// makes no call; without any Node it refuses too.
#[tokio::test]
async fn orphans_delete_refuses_a_kubeconfig_of_another_cluster() -> Result<()> {
    let (cluster, moto) = tokio::try_join!(TestCluster::start(), Moto::start())?;
    let e2e = moto.build_world("e2e", 1).await?;
    let other = moto.build_world("other", 2).await?;
    let config = cluster.dir().join("cloud.conf");
    std::fs::write(&config, moto.cloud_config(&e2e))?;
    // An orphan of cluster e2e.
    moto.create_classic_elb(
        "a0000000000000000000000000000e2e",
        &e2e.subnets[0].1,
        &[
            ("kubernetes.io/cluster/e2e", "owned"),
            ("kubernetes.io/service-name", "default/web"),
        ],
    )
    .await?;
    let args = vec![
        format!("--cloud-config={}", config.display()),
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        "--cluster-name=e2e".to_string(),
    ];
    let mut delete = args.clone();
    delete.extend(["--delete".to_string(), "--yes".to_string()]);

    let before = moto.requests().len();
    let (code, out, err) = orphans(&moto, &delete)?;
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        err.contains("no Node of the kubeconfig's cluster has an AWS provider ID"),
        "{err}"
    );
    assert_eq!(moto.mutations_since(before), vec![]);

    let nodes: Api<Node> = Api::all(cluster.client().await?);
    for (i, instance) in other.instances.iter().enumerate() {
        nodes
            .create(
                &PostParams::default(),
                &rcp_e2e::k8s::node_with_provider_id(&format!("other-{i}"), &instance.provider_id()),
            )
            .await?;
    }
    let (code, out, err) = orphans(&moto, &args)?;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("a0000000000000000000000000000e2e"), "{out}");
    let (code, out, err) = orphans(&moto, &delete)?;
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        err.contains("the kubeconfig's cluster does not look like the cluster \"e2e\" of the cloud config")
            && err.contains(&format!(
                "Node other-0's instance {} does not carry the tag kubernetes.io/cluster/e2e",
                other.instances[0].id
            )),
        "{err}"
    );
    assert_eq!(moto.mutations_since(before), vec![]);
    Ok(())
}

/// Reads the child's stdout until `needle` shows (the prompt has no newline).
fn read_until(out: &mut impl Read, needle: &str, seen: &mut String) -> Result<()> {
    let mut buf = [0u8; 4096];
    while !seen.contains(needle) {
        let n = out.read(&mut buf)?;
        anyhow::ensure!(n > 0, "the command ended before {needle:?}:\n{seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    Ok(())
}

/// Three Services whose Classic ELB must stay while the CCM is stopped: one switched to an NLB
/// (its status still shows the Classic ELB), one moved to another controller (`type:
/// external`), one that gave up its load balancer (ClusterIP, finalizer and status gone: its
/// Classic ELB is an orphan) and wants it back while `--delete`'s prompt waits. The switched
/// and moved ones are never listed; a prompt nobody answers deletes nothing at its deadline;
/// the one that wants its load balancer again keeps it. Not one mutating call.
#[tokio::test]
async fn what_serves_a_service_in_a_switch_or_wanted_again_at_the_prompt_is_kept() -> Result<()> {
    let mut s = setup("ccm-aws-orphans-switch").await?;
    let client = s.cluster.client().await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    for name in ["switch", "moved", "back"] {
        services
            .create(
                &PostParams::default(),
                &load_balancer_service(name, &[], &[(80, "http")]),
            )
            .await?;
    }
    let mut lbs = Vec::new();
    for name in ["switch", "moved", "back"] {
        lbs.push(k8s_cloud_provider::service::helpers::default_load_balancer_name(
            &wait_for_ingress(&services, name, T).await?,
        ));
    }
    stop(&mut s.ccm)?;
    let annotate = |kind: &str| {
        serde_json::json!({"metadata": {"annotations": {
            "service.beta.kubernetes.io/aws-load-balancer-type": kind
        }}})
    };
    services
        .patch("switch", &PatchParams::default(), &Patch::Merge(&annotate("nlb")))
        .await?;
    services
        .patch(
            "moved",
            &PatchParams::default(),
            &Patch::Merge(&annotate("external")),
        )
        .await?;
    // `back` gives up its load balancer: ClusterIP, and what the CCM would have cleared.
    services
        .patch(
            "back",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({
                "metadata": {"finalizers": null},
                "spec": {"type": "ClusterIP"}
            })),
        )
        .await?;
    services
        .patch_status(
            "back",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"status": {"loadBalancer": {"ingress": null}}})),
        )
        .await?;
    let moto = &s.moto;
    let before = moto.requests().len();
    let (code, out, err) = orphans(moto, &s.args)?;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        !out.contains(&lbs[0]) && !out.contains(&lbs[1]),
        "what serves is no orphan:\n{out}"
    );
    assert!(
        out.contains(&lbs[2]),
        "back's load balancer is an orphan now:\n{out}"
    );

    // A prompt nobody answers.
    let binary = paths::workspace_binary("cloud-controller-manager-aws")?;
    let mut args = vec!["orphans".to_string()];
    args.extend(s.delete_args(&["--prompt-timeout=2s"]));
    let mut child = Command::new(&binary)
        .args(&args)
        .envs(moto.sdk_env())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdin_kept_open = child.stdin.take();
    let out = child.wait_with_output()?;
    drop(stdin_kept_open);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no answer within --prompt-timeout=2s; nothing is deleted"),
        "{err}"
    );
    assert_eq!(moto.mutations_since(before), vec![]);

    // A listing past its deadline lists and deletes nothing.
    let mut late = vec!["orphans".to_string()];
    late.extend(s.delete_args(&["--yes", "--list-timeout=1ms"]));
    let out = Command::new(&binary)
        .args(&late)
        .envs(moto.sdk_env())
        .env("RUST_LOG", "warn")
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the listing took longer than --list-timeout=1ms; nothing is listed or deleted"),
        "{err}"
    );
    assert_eq!(moto.mutations_since(before), vec![]);

    // `back` wants its load balancer again while the prompt waits; then "y".
    let mut child = Command::new(&binary)
        .args(&args[..args.len() - 1])
        .envs(moto.sdk_env())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stdout = child.stdout.take().context("stdout")?;
    let mut seen = String::new();
    read_until(&mut stdout, "[y/N]", &mut seen)?;
    services
        .patch(
            "back",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"spec": {"type": "LoadBalancer"}})),
        )
        .await?;
    child.stdin.take().context("stdin")?.write_all(b"y\n")?;
    stdout.read_to_string(&mut seen)?;
    let status = child.wait()?;
    println!("{seen}");
    assert_eq!(status.code(), Some(0), "{seen}");
    assert!(
        seen.contains(&format!("not deleted classic-elb {}", lbs[2])),
        "{seen}"
    );
    assert_eq!(moto.mutations_since(before), vec![], "not one mutating call");
    for lb in &lbs {
        assert!(!classic_groups(moto, lb).await?.is_empty(), "{lb} is still there");
    }
    Ok(())
}
