//! The tagging controller (AWS-64) on the real AWS cloud-controller-manager, kube-apiserver and
//! moto (behind the fault proxy): the instances of new Nodes get `--tags` and the Nodes the
//! `k8s.io/cloud-provider-aws` label; a failing `CreateTags` is retried until it succeeds;
//! deleting a Node removes its tags and nothing else (not the cluster tag, not a tag someone
//! changed since); batching sends one `CreateTags` for several Nodes; bad flags stop the
//! command with the flag named.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Result;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use rcp_e2e::{
    Moto, TestCluster,
    ccm::{CcmProcess, run_to_exit},
    fault_proxy::{Action, FaultProxy, Rule, aws_error_body},
    k8s::{register_tainted_nodes, wait_for},
};

const T: Duration = Duration::from_secs(90);
const LABEL: &str = "k8s.io/cloud-provider-aws";
/// MD5 of "env=e2e,team=blue" (Python's hashlib): the label value for `--tags=team=blue,env=e2e`.
const CHECKSUM: &str = "d209c4211a717ea1b252990fe147d843";

/// The instance's tags, read from moto directly.
async fn instance_tags(moto: &Moto, id: &str) -> Result<BTreeMap<String, String>> {
    let out = moto
        .ec2()
        .describe_tags()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("resource-id")
                .values(id)
                .build(),
        )
        .send()
        .await?;
    Ok(out
        .tags()
        .iter()
        .map(|t| {
            (
                t.key().unwrap_or_default().to_string(),
                t.value().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

fn has_user_tags(tags: &BTreeMap<String, String>) -> bool {
    tags.get("team").map(String::as_str) == Some("blue") && tags.get("env").map(String::as_str) == Some("e2e")
}

async fn label(nodes: &Api<Node>, name: &str) -> Option<String> {
    nodes.get(name).await.ok()?.metadata.labels?.get(LABEL).cloned()
}

#[tokio::test]
async fn instances_of_nodes_are_tagged_a_failing_create_tags_is_retried_and_deletes_untag() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let moto = Moto::start().await?;
    let world = moto.build_world("e2e", 4).await?;
    let proxy = FaultProxy::start(moto.endpoint()).await?;
    let config = cluster.dir().join("cloud.conf");
    std::fs::write(
        &config,
        moto.cloud_config(&world)
            .replace(moto.endpoint(), &format!("http://127.0.0.1:{}", proxy.port())),
    )?;
    let [failing, tagged, changed, refused] = &world.instances[..] else {
        anyhow::bail!("four instances expected");
    };
    // CreateTags naming `failing` is refused three times, naming `refused` always (a code the
    // SDK does not retry, so that what retries is the controller).
    let refusal = Action::Respond {
        status: 403,
        body: aws_error_body(
            "Version=2016-11-15",
            "UnauthorizedOperation",
            "injected by the test",
        ),
    };
    proxy.add(Rule::new(&["Action=CreateTags", &failing.id], refusal.clone()).times(3));
    proxy.add(Rule::new(&["Action=CreateTags", &refused.id], refusal));
    let ccm = CcmProcess::start_with_env(
        "cloud-controller-manager-aws",
        "ccm-aws-tagging",
        &cluster.ccm_kubeconfig("aws/base")?,
        cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--leader-elect=false".into(),
            "--cluster-name=e2e".into(),
            "--controllers=*,tagging".into(),
            "--tags=team=blue,env=e2e".into(),
            "--resources=instance".into(),
        ],
        &moto.sdk_env(),
    )?;
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    register_tainted_nodes(&nodes, &world.node_names(), Some(T)).await?;

    // The two healthy instances get the tags, their Nodes the label.
    for i in [tagged, changed] {
        wait_for(&format!("{} tagged", i.id), T, || async {
            has_user_tags(&instance_tags(&moto, &i.id).await.ok()?).then_some(())
        })
        .await?;
        let name = i.private_dns_name.as_str();
        wait_for(&format!("{name} labelled"), T, || async {
            (label(&nodes, name).await.as_deref() == Some(CHECKSUM)).then_some(())
        })
        .await?;
    }
    // The one refused three times is retried (each failure counted) and then tagged.
    wait_for(
        &format!("{} tagged after three refusals", failing.id),
        T,
        || async { has_user_tags(&instance_tags(&moto, &failing.id).await.ok()?).then_some(()) },
    )
    .await?;
    wait_for("its Node labelled", T, || async {
        (label(&nodes, &failing.private_dns_name).await.as_deref() == Some(CHECKSUM)).then_some(())
    })
    .await?;
    let errors = |kind: &str, id: &str| {
        format!(
            "cloudprovider_aws_tagging_controller_work_item_errors_total{{error_type=\"{kind}\",instance_id=\"{id}\"}}"
        )
    };
    assert_eq!(ccm.metric_value(&errors("total_errors", &failing.id)).await, 3.0);
    // The one always refused is retried 9 times, then given up (and counted as such); it is
    // neither tagged nor labelled.
    wait_for("retries exhausted on the always-refused instance", T, || async {
        (ccm.metric_value(&errors("errors_after_retries_exhausted", &refused.id))
            .await
            == 1.0)
            .then_some(())
    })
    .await?;
    assert_eq!(ccm.metric_value(&errors("total_errors", &refused.id)).await, 9.0);
    assert!(!has_user_tags(&instance_tags(&moto, &refused.id).await?));
    assert_eq!(label(&nodes, &refused.private_dns_name).await, None);
    assert!(
        proxy.faulted() >= 13,
        "the refusals were served: {}",
        proxy.faulted()
    );

    // Someone changes one tag of the third instance; the always-refused one gets the same tags
    // from elsewhere (as from a launch template). Then three Nodes are deleted.
    moto.ec2()
        .create_tags()
        .resources(&changed.id)
        .tags(
            aws_sdk_ec2::types::Tag::builder()
                .key("team")
                .value("red")
                .build(),
        )
        .send()
        .await?;
    moto.ec2()
        .create_tags()
        .resources(&refused.id)
        .tags(
            aws_sdk_ec2::types::Tag::builder()
                .key("team")
                .value("blue")
                .build(),
        )
        .tags(aws_sdk_ec2::types::Tag::builder().key("env").value("e2e").build())
        .send()
        .await?;
    for i in [tagged, changed, refused] {
        nodes
            .delete(&i.private_dns_name, &DeleteParams::default())
            .await?;
    }
    wait_for("the deleted Node's instance untagged", T, || async {
        let tags = instance_tags(&moto, &tagged.id).await.ok()?;
        (!tags.contains_key("team") && !tags.contains_key("env")).then_some(tags)
    })
    .await?;
    let left = instance_tags(&moto, &tagged.id).await?;
    assert_eq!(
        left.get("kubernetes.io/cluster/e2e").map(String::as_str),
        Some("owned"),
        "the cluster tag stays: {left:?}"
    );
    wait_for("env removed from the changed instance", T, || async {
        let tags = instance_tags(&moto, &changed.id).await.ok()?;
        (!tags.contains_key("env")).then_some(())
    })
    .await?;
    let kept = instance_tags(&moto, &changed.id).await?;
    assert_eq!(
        kept.get("team").map(String::as_str),
        Some("red"),
        "a tag changed by someone else is not removed: {kept:?}"
    );
    // The Node this controller never tagged (no label) is not untagged: its tags stay.
    let skipped = format!("Skip untagging node {}", refused.private_dns_name);
    wait_for("the unlabelled Node's deletion seen", T, || async {
        ccm.log().contains(&skipped).then_some(())
    })
    .await?;
    assert!(
        has_user_tags(&instance_tags(&moto, &refused.id).await?),
        "tags not set by the controller stay"
    );
    // The remaining Node keeps its tags.
    assert!(has_user_tags(&instance_tags(&moto, &failing.id).await?));
    // moto applies a DeleteTags before the CCM has its answer and counts the call: wait for
    // the count rather than read it once (it read 1 under CI load).
    wait_for("two DeleteTags calls counted", T, || async {
        (ccm.metric_value("cloudprovider_aws_api_request_duration_seconds_count{request=\"delete_tags\"}")
            .await
            >= 2.0)
            .then_some(())
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn batching_tags_several_nodes_in_one_call() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let moto = Moto::start().await?;
    let world = moto.build_world("e2e", 4).await?;
    let config = cluster.dir().join("cloud.conf");
    std::fs::write(&config, moto.cloud_config(&world))?;
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    // Nodes that exist before the controller starts are all queued at once.
    for i in &world.instances {
        nodes.create(&PostParams::default(), &i.node()).await?;
    }
    let ccm = CcmProcess::start_with_env(
        "cloud-controller-manager-aws",
        "ccm-aws-tagging-batch",
        &cluster.ccm_kubeconfig("aws/base")?,
        cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--leader-elect=false".into(),
            "--cluster-name=e2e".into(),
            "--controllers=tagging".into(),
            "--tags=team=blue,env=e2e".into(),
            "--resources=instance".into(),
            "--tagging-controller-enable-batching".into(),
            "--tagging-controller-concurrent-node-syncs=4".into(),
        ],
        &moto.sdk_env(),
    )?;
    for i in &world.instances {
        wait_for(&format!("{} tagged", i.id), T, || async {
            has_user_tags(&instance_tags(&moto, &i.id).await.ok()?).then_some(())
        })
        .await?;
    }
    for i in &world.instances {
        wait_for(&format!("{} labelled", i.private_dns_name), T, || async {
            (label(&nodes, &i.private_dns_name).await.as_deref() == Some(CHECKSUM)).then_some(())
        })
        .await?;
    }
    let calls = ccm
        .metric_value("cloudprovider_aws_api_request_duration_seconds_count{request=\"create_tags\"}")
        .await;
    println!("4 Nodes tagged with {calls} CreateTags call(s)");
    assert!(
        (1.0..4.0).contains(&calls),
        "batched: {calls} calls for 4 instances"
    );
    assert!(ccm.log().contains("sending a batched tag call"), "{}", ccm.log());
    Ok(())
}

#[test]
fn bad_tagging_flags_stop_the_command_with_the_flag_named() -> Result<()> {
    let (code, out, _) = run_to_exit("cloud-controller-manager-aws", &["--help"])?;
    assert_eq!(code, 0);
    assert!(out.contains("Tagging controller flags"), "{out}");
    for flag in [
        "--tags",
        "--resources",
        "--tagging-controller-rate-limit",
        "--tagging-controller-burst-limit",
        "--tagging-controller-concurrent-node-syncs",
        "--tagging-controller-enable-batching",
    ] {
        assert!(out.contains(flag), "{flag} in --help");
    }
    for (args, needle) in [
        (vec!["--controllers=*,tagging"], "--tags must not be empty"),
        (
            vec![
                "--controllers=*,tagging",
                "--tags=kubernetes.io/cluster/e2e=owned",
                "--resources=instance",
            ],
            "cluster-ownership tag",
        ),
        (
            vec!["--controllers=tagging", "--tags=a=b", "--resources=volume"],
            "--resources: volume is not a supported resource",
        ),
    ] {
        let mut all = vec!["--kubeconfig=/nonexistent", "--leader-elect=false"];
        all.extend(args.iter().copied());
        let (code, _, err) = run_to_exit("cloud-controller-manager-aws", &all)?;
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {needle} not in {err}");
    }
    Ok(())
}
