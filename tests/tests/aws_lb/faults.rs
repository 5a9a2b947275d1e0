//! Answers a proxy between the CCM and moto alters: a target group still in use, a lost
//! create answer, throttling.

use crate::aws_lb::env::*;

/// An environment of `nodes` machines with the fault proxy between the CCM and moto.
async fn fault_env(nodes: usize) -> Result<Env> {
    env_opts(
        nodes,
        EnvOptions {
            fault_proxy: true,
            ..Default::default()
        },
    )
    .await
}

/// An environment whose proxy answers the NLB's first `times` `CreateLoadBalancer` requests
/// with `action`, and an NLB Service `name` made in it, with its ingress set; then checks that
/// it was made within one sync (no failed sync, `expected_log` in the CCM's log `log_times`
/// times), that moto saw one `CreateLoadBalancer` and holds one NLB.
async fn nlb_made_through_create_faults(
    name: &str,
    action: Action,
    times: usize,
    expected_log: &str,
    log_times: usize,
) -> Result<Env> {
    let env = fault_env(2).await?;
    let proxy = env.proxy.as_ref().expect("proxy");
    proxy.add(Rule::new(&["Action=CreateLoadBalancer", "Type=network"], action).times(times));
    env.services
        .create(
            &PostParams::default(),
            &load_balancer_service(name, &[("type", "nlb")], &[(80, "http")]),
        )
        .await?;
    ingress(&env.services, name).await?;
    assert_eq!(proxy.faulted(), times, "the faults were injected");
    let log = env._ccm.log();
    assert_eq!(log.matches(expected_log).count(), log_times, "{}", ccm_tail(&env));
    assert!(
        !log.contains(&format!("error syncing default/{name}")),
        "made within one sync:\n{}",
        ccm_tail(&env)
    );
    let creates = env
        .moto
        .actions()
        .iter()
        .filter(|a| *a == "CreateLoadBalancer")
        .count();
    assert_eq!(creates, 1, "moto saw one CreateLoadBalancer");
    let lbs = env.moto.elbv2().describe_load_balancers().send().await?;
    assert_eq!(lbs.load_balancers().len(), 1, "{lbs:?}");
    Ok(env)
}

/// Deletes the Service `name` and checks that nothing of it is left.
async fn delete_and_check_nothing_left(env: &Env, name: &str) -> Result<()> {
    env.services.delete(name, &DeleteParams::default()).await?;
    wait_for(&format!("service {name} gone"), T, || async {
        env.services.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await?;
    nothing_left(env).await
}

/// A replaced target group whose deletion fails (`ResourceInUse`, injected by a proxy between
/// the CCM and moto) is found again by its tags: the Service's deletion keeps its finalizer
/// while a target group of it is still in use, and completes, leaving nothing, once it is not.
#[tokio::test]
async fn a_target_group_that_cannot_be_deleted_yet_is_swept_later() -> Result<()> {
    let env = fault_env(2).await?;
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
/// is not re-sent blindly: moto, unlike AWS, is not idempotent by name and would make a second
/// NLB that outlives the Service (CI once leaked one under random faults). The same sync looks
/// the NLB up by name before trying again, finds the one the lost call made and completes it
/// (no failed sync); one NLB, one create, and the Service's deletion leaves nothing, even with
/// a second NLB of the same name.
#[tokio::test]
async fn a_lost_create_answer_makes_no_second_nlb() -> Result<()> {
    let env = nlb_made_through_create_faults(
        "twice",
        Action::LoseAnswer {
            status: 500,
            body: "<ErrorResponse><Error><Type>Receiver</Type><Code>InternalFailure</Code><Message>lost</Message></Error><RequestId>fault</RequestId></ErrorResponse>".into(),
        },
        1,
        "the NLB was made by the create whose answer was lost",
        1,
    )
    .await?;
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
    delete_and_check_nothing_left(&env, "twice").await
}

/// A throttled or failed `CreateLoadBalancer` of an NLB (each attempt sent once) is tried again
/// within the same sync after a look-up by name finds no NLB: two throttled attempts, then the
/// NLB is made by the third, with no failed sync and the throttled attempts counted.
#[tokio::test]
async fn a_throttled_nlb_create_is_tried_again_within_the_sync() -> Result<()> {
    let env = nlb_made_through_create_faults(
        "throttled",
        Action::Respond {
            status: 400,
            body: "<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error><RequestId>fault</RequestId></ErrorResponse>".into(),
        },
        2,
        "creating the NLB failed; looking it up before trying again",
        2,
    )
    .await?;
    delete_and_check_nothing_left(&env, "throttled").await
}

/// Throttling the SDK retried is still throttling: every throttled attempt (not only the call's
/// final error) counts for the region's shared back-off and
/// `cloudprovider_aws_api_throttled_requests_total{operation_name}` (AWS operation names, as
/// upstream).
#[tokio::test]
async fn every_throttled_attempt_counts_not_only_the_final_error() -> Result<()> {
    let env = fault_env(1).await?;
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

/// A lost answer to the revocation of the NLB's client rule (the proxy forwards it, then
/// answers 500; the SDK's retry finds the rule gone: `InvalidPermission.NotFound`) fails
/// nothing: the deletion goes on at once, and the path-MTU rule the client rule needed goes
/// with it. (CI's 30 % fault run once left that rule behind: the failed deletion was retried,
/// found no rule of the NLB any more and never reached the path-MTU step.)
#[tokio::test]
async fn a_lost_revoke_answer_leaves_no_rule_behind() -> Result<()> {
    let env = fault_env(2).await?;
    let proxy = env.proxy.as_ref().expect("proxy");
    env.services
        .create(
            &PostParams::default(),
            &load_balancer_service("lost", &[("type", "nlb")], &[(80, "http")]),
        )
        .await?;
    ingress(&env.services, "lost").await?;
    proxy.add(
        Rule::new(
            &["Action=RevokeSecurityGroupIngress"],
            Action::LoseAnswer {
                status: 500,
                body: "<Response><Errors><Error><Code>InternalError</Code><Message>lost</Message></Error></Errors><RequestID>fault</RequestID></Response>".into(),
            },
        )
        .times(1),
    );
    env.services.delete("lost", &DeleteParams::default()).await?;
    wait_for("service lost gone", T, || async {
        env.services.get_opt("lost").await.ok()?.is_none().then_some(())
    })
    .await?;
    nothing_left(&env).await?;
    assert_eq!(proxy.faulted(), 1, "one revocation's answer was lost");
    let client = env.cluster.client().await?;
    let failures: Vec<_> = events_for(&client, "default", "lost")
        .await?
        .into_iter()
        .filter(|(reason, _, _)| reason.contains("Failed"))
        .collect();
    assert!(failures.is_empty(), "the deletion did not fail: {failures:?}");
    Ok(())
}
