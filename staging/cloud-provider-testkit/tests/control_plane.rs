//! The kit against real servers: a control plane, the framework's CCM in-process with a
//! provider (the framework's fake), a Node initialised and a Service given its address.

use std::time::Duration;

use k8s_cloud_provider::{
    app::{FactoryContext, ProviderSpec},
    fake::{FakeCloud, FakeInstance},
};
use k8s_cloud_provider_testkit::{ControlPlane, TestkitError, objects, wait_for};
use k8s_openapi::api::core::v1::{Node, Service};

#[tokio::test]
async fn a_provider_initialises_a_node_and_serves_a_service_on_a_real_api_server() {
    let cp = ControlPlane::start().await.expect("control plane");
    let cloud = FakeCloud::new();
    cloud.add_instance("node-a", FakeInstance::new("fake://node-a").instance_type("m1"));
    cloud.set_ingress_ip(Some("192.0.2.7"));
    let spec = ProviderSpec::new("fake", move |_ctx: FactoryContext| {
        let cloud = cloud.clone();
        async move { Ok::<_, String>(cloud) }
    });
    // A flag the command refuses is an error before anything runs.
    let refused = cp
        .run_ccm(spec.clone(), &["--no-such-flag"])
        .expect_err("an unknown flag");
    assert!(matches!(refused, TestkitError::Flags(_)), "{refused}");

    let ccm = cp
        .run_ccm(spec, &["--controllers=cloud-node,service"])
        .expect("the CCM");
    let client = cp.client().await.expect("client");
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    nodes
        .create(&Default::default(), &objects::node("node-a"))
        .await
        .expect("node");
    let provider_id = wait_for("node-a initialised", Duration::from_secs(60), || async {
        nodes.get("node-a").await.ok()?.spec?.provider_id
    })
    .await
    .expect("initialised");
    assert_eq!(provider_id, "fake://node-a");
    let services: kube::Api<Service> = kube::Api::namespaced(client, "default");
    services
        .create(&Default::default(), &objects::load_balancer_service("web", &[80]))
        .await
        .expect("service");
    let ip = wait_for("web's ingress", Duration::from_secs(60), || async {
        objects::ingress(&services.get("web").await.ok()?)
    })
    .await
    .expect("ingress");
    assert_eq!(ip, "192.0.2.7");
    assert!(ccm.is_running());
    ccm.stop().await.expect("a clean stop");
}
