//! A cloud call that hangs (a proxy in front of moto that never answers one request) is
//! abandoned after `--cloud-call-timeout`: a Warning says why, the other Services are still
//! reconciled by the one default worker, and the Service recovers once the cloud answers.

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{Api, api::PostParams};
use rcp_e2e::{
    Moto, TestCluster,
    ccm::CcmProcess,
    fault_proxy::{Action, FaultProxy, Rule},
    k8s::{events_for, load_balancer_service, register_tainted_nodes, wait_for, wait_for_ingress},
};

const T: Duration = Duration::from_secs(90);

async fn ingress(services: &Api<Service>, name: &str) -> Result<Service> {
    wait_for_ingress(services, name, T).await
}

#[tokio::test]
async fn a_hung_aws_call_times_out_and_the_other_services_are_still_served() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let moto = Moto::start().await?;
    let world = moto.build_world("e2e", 2).await?;
    let proxy = FaultProxy::start(moto.endpoint()).await?;
    let config = cluster.dir().join("cloud.conf");
    std::fs::write(
        &config,
        moto.cloud_config(&world)
            .replace(moto.endpoint(), &format!("http://127.0.0.1:{}", proxy.port())),
    )?;
    let ccm = CcmProcess::start_with_env(
        "cloud-controller-manager-aws",
        "ccm-aws-timeout",
        &cluster.ccm_kubeconfig("aws/base")?,
        cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--leader-elect=false".into(),
            "--cluster-name=e2e".into(),
            "--cloud-call-timeout=5s".into(),
        ],
        &moto.sdk_env(),
    )?;
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    register_tainted_nodes(&nodes, &world.node_names(), Some(T)).await?;

    // The Classic ELB of default/stuck is created with its service-name tag in the body.
    proxy.add(Rule::new(
        &["Action=CreateLoadBalancer", "default%2Fstuck"],
        Action::Hang,
    ));
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .create(
            &PostParams::default(),
            &load_balancer_service("stuck", &[], &[(80, "http")]),
        )
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    services
        .create(
            &PostParams::default(),
            &load_balancer_service("fine", &[], &[(80, "http")]),
        )
        .await?;
    ingress(&services, "fine").await?;
    let warning = wait_for("a Warning on the stuck Service", T, || async {
        events_for(&client, "default", "stuck")
            .await
            .ok()?
            .into_iter()
            .find(|e| e.0 == "SyncLoadBalancerFailed" && e.1.contains("did not return within 5s"))
    })
    .await?;
    println!("{warning:?}");
    assert!(proxy.faulted() >= 1, "the request did hang");
    assert!(
        ccm.metric_value(
            "cloudprovider_api_call_timeouts_total{controller=\"service-lb-controller\",operation=\"EnsureLoadBalancer\"}"
        )
        .await
            >= 1.0
    );
    // The cloud answers again: the Service gets its load balancer.
    proxy.clear();
    ingress(&services, "stuck").await?;
    Ok(())
}
